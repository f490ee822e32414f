// Status formatting.
// No state: callable from any thread.
#include "pmindex/status.h"

namespace pmindex {

const char* Status::CodeName(Code c) {
  switch (c) {
    case Code::kOk: return "OK";
    case Code::kNotFound: return "NotFound";
    case Code::kAlreadyExists: return "AlreadyExists";
    case Code::kInvalidArgument: return "InvalidArgument";
    case Code::kPoolFull: return "PoolFull";
    case Code::kCorrupt: return "Corrupt";
    case Code::kUnsupported: return "Unsupported";
    case Code::kIOError: return "IOError";
    case Code::kBusy: return "Busy";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  std::string s = CodeName(code_);
  if (msg_ && !msg_->empty()) {
    s += ": ";
    s += *msg_;
  }
  return s;
}

}  // namespace pmindex
