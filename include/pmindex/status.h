// pmindex/status.h: the result of every fallible operation.
//
// Modelled on LevelDB's Status: a code plus a human-readable message. An OK
// status carries no allocation, so returning Status on the hot path is cheap.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace pmindex {

class Status {
 public:
  enum class Code : unsigned char {
    kOk = 0,
    kNotFound,
    kAlreadyExists,
    kInvalidArgument,
    kPoolFull,
    kCorrupt,
    kUnsupported,
    kIOError,
    kBusy,  // e.g. the pool is already open in another process
  };

  Status() noexcept = default;
  Status(const Status& o) : code_(o.code_), msg_(o.msg_ ? new std::string(*o.msg_) : nullptr) {}
  Status& operator=(const Status& o) {
    if (this != &o) {
      code_ = o.code_;
      msg_.reset(o.msg_ ? new std::string(*o.msg_) : nullptr);
    }
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status OK() { return Status(); }
  static Status NotFound(std::string_view m = {}) { return Status(Code::kNotFound, m); }
  static Status AlreadyExists(std::string_view m = {}) { return Status(Code::kAlreadyExists, m); }
  static Status InvalidArgument(std::string_view m = {}) { return Status(Code::kInvalidArgument, m); }
  static Status PoolFull(std::string_view m = {}) { return Status(Code::kPoolFull, m); }
  static Status Corrupt(std::string_view m = {}) { return Status(Code::kCorrupt, m); }
  static Status Unsupported(std::string_view m = {}) { return Status(Code::kUnsupported, m); }
  static Status IOError(std::string_view m = {}) { return Status(Code::kIOError, m); }
  static Status Busy(std::string_view m = {}) { return Status(Code::kBusy, m); }

  bool ok() const { return code_ == Code::kOk; }
  bool IsNotFound() const { return code_ == Code::kNotFound; }
  bool IsAlreadyExists() const { return code_ == Code::kAlreadyExists; }
  bool IsInvalidArgument() const { return code_ == Code::kInvalidArgument; }
  bool IsPoolFull() const { return code_ == Code::kPoolFull; }
  bool IsCorrupt() const { return code_ == Code::kCorrupt; }
  bool IsUnsupported() const { return code_ == Code::kUnsupported; }
  bool IsIOError() const { return code_ == Code::kIOError; }
  bool IsBusy() const { return code_ == Code::kBusy; }

  Code code() const { return code_; }
  // The message alone (may be empty).
  std::string_view message() const { return msg_ ? std::string_view(*msg_) : std::string_view(); }
  // "NotFound: message".
  std::string ToString() const;
  static const char* CodeName(Code c);

 private:
  Status(Code c, std::string_view m) : code_(c), msg_(m.empty() ? nullptr : new std::string(m)) {}
  Code code_ = Code::kOk;
  std::unique_ptr<std::string> msg_;
};

}  // namespace pmindex

// Propagates a non-OK status to the caller.
#define PMINDEX_RETURN_IF_ERROR(expr)            \
  do {                                           \
    ::pmindex::Status _pmindex_st = (expr);      \
    if (!_pmindex_st.ok()) return _pmindex_st;   \
  } while (0)
