// _pmindex.cc: the Python extension module pmindex._pmindex (pybind11), a thin
// layer over pmindex::KV (include/pmindex/kv.h). Keys and values cross as
// bytes; python/src/pmindex/__init__.py turns them into the Pythonic API
// (ints for u64 kinds, dict protocol, context manager, exceptions by status).
//
// A failed Status is raised as pmindex.Error subclasses: the translator calls
// pmindex._errors.from_status(code_name, message) for the exception object.
// Every engine call releases the GIL, so Python threads may share a store
// when its engine is concurrent (KV's own contract); a Store or Iterator must
// not be used after close().
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "pmindex/kv.h"

namespace py = pybind11;
using pmindex::KV;
using pmindex::KVIterator;
using pmindex::Slice;
using pmindex::Status;

namespace {

struct StatusError {
  Status status;
};

void Check(const Status& s) {
  if (!s.ok()) throw StatusError{s};
}

Slice AsSlice(const py::bytes& b) {
  char* p = nullptr;
  Py_ssize_t n = 0;
  PyBytes_AsStringAndSize(b.ptr(), &p, &n);
  return Slice(p, size_t(n));
}

class Store {
 public:
  Store(const std::string& path, const std::string& engine, uint64_t size, bool create, bool error_if_exists,
        bool u64_keys, bool u64_values, const std::map<std::string, std::string>& params) {
    pmindex::KVConfig c;
    c.path = path;
    c.size = size;
    c.create_if_missing = create;
    c.error_if_exists = error_if_exists;
    c.key_kind = u64_keys ? pmindex::KeyKind::kU64 : pmindex::KeyKind::kBytes;
    c.value_kind = u64_values ? pmindex::ValueKind::kU64 : pmindex::ValueKind::kBytes;
    c.params = params;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = KV::Open(engine, c, &kv_);
    }
    Check(s);
  }
  KV* kv() {
    if (!kv_ || !kv_->is_open()) throw StatusError{Status::InvalidArgument("the store is closed")};
    return kv_.get();
  }
  py::bytes Get(const py::bytes& key) {
    Slice k = AsSlice(key);
    std::string v;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = kv()->get(k, &v);
    }
    Check(s);
    return py::bytes(v);
  }
  void Put(const py::bytes& key, const py::bytes& value) {
    Slice k = AsSlice(key), v = AsSlice(value);
    Status s;
    {
      py::gil_scoped_release nogil;
      s = kv()->put(k, v);
    }
    Check(s);
  }
  void Remove(const py::bytes& key) {
    Slice k = AsSlice(key);
    Status s;
    {
      py::gil_scoped_release nogil;
      s = kv()->remove(k);
    }
    Check(s);
  }
  bool Exists(const py::bytes& key) {
    Slice k = AsSlice(key);
    Status s;
    {
      py::gil_scoped_release nogil;
      s = kv()->exists(k);
    }
    if (s.IsNotFound()) return false;
    Check(s);
    return true;
  }
  // One entry per key: the value, or None when absent.
  py::list GetMany(const std::vector<py::bytes>& keys) {
    std::vector<Slice> ks;
    ks.reserve(keys.size());
    for (const auto& k : keys) ks.push_back(AsSlice(k));
    std::vector<std::string> vs;
    std::vector<Status> ss;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = kv()->get_many(ks, &vs, &ss);
    }
    Check(s);
    py::list out;
    for (size_t i = 0; i < vs.size(); i++) {
      if (ss[i].ok()) out.append(py::bytes(vs[i]));
      else out.append(py::none());
    }
    return out;
  }
  uint64_t Count(const py::object& above, const py::object& below) {
    uint64_t n = 0;
    Status s;
    KV* k = kv();
    if (above.is_none() && below.is_none()) {
      s = k->count_all(&n);
    } else if (below.is_none()) {
      Slice a = AsSlice(above.cast<py::bytes>());
      py::gil_scoped_release nogil;
      s = k->count_above(a, &n);
    } else if (above.is_none()) {
      Slice b = AsSlice(below.cast<py::bytes>());
      py::gil_scoped_release nogil;
      s = k->count_below(b, &n);
    } else {
      py::bytes ab = above.cast<py::bytes>(), bb = below.cast<py::bytes>();
      Slice a = AsSlice(ab), b = AsSlice(bb);
      py::gil_scoped_release nogil;
      s = k->count_between(a, b, &n);
    }
    Check(s);
    return n;
  }
  void Close() {
    if (!kv_) return;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = kv_->close();
    }
    kv_.reset();
    Check(s);
  }
  bool closed() const { return !kv_ || !kv_->is_open(); }
  std::string engine() { return kv()->info().name; }
  bool ordered() { return kv()->info().ordered; }
  bool u64_keys() { return kv()->key_kind() == pmindex::KeyKind::kU64; }
  bool u64_values() { return kv()->value_kind() == pmindex::ValueKind::kU64; }
  py::dict Stats() {
    pmindex::IndexStats st;
    Check(kv()->stats(&st));
    py::dict d;
    d["records"] = st.records;
    d["pm_bytes"] = st.pm_bytes;
    d["dram_bytes"] = st.dram_bytes;
    d["recovery_seconds"] = st.recovery_seconds;
    return d;
  }

 private:
  std::unique_ptr<KV> kv_;
};

// Batches of an iterator: list of (key, value) from the current position.
class Iter {
 public:
  explicit Iter(py::object store) : store_(std::move(store)) {
    Check(store_.cast<Store&>().kv()->new_iterator(&it_));
  }
  void Seek(const py::object& key) {
    Status s;
    Live();
    if (key.is_none()) {
      s = it_->seek_to_first();
    } else {
      Slice k = AsSlice(key.cast<py::bytes>());
      s = it_->seek(k);
    }
    Check(s);
  }
  py::list Batch(size_t n) {
    Live();
    py::list out;
    while (it_->valid() && out.size() < n) {
      out.append(py::make_tuple(py::bytes(std::string(it_->key())), py::bytes(std::string(it_->value()))));
      Check(it_->next());
    }
    Check(it_->status());
    return out;
  }

 private:
  void Live() { (void)store_.cast<Store&>().kv(); }  // raises once the store is closed
  py::object store_;  // keeps the Store (and its KV) alive
  std::unique_ptr<KVIterator> it_;
};

}  // namespace

PYBIND11_MODULE(_pmindex, m) {
  m.doc() = "pmindex native layer (use the pmindex package)";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object exc = py::module_::import("pmindex._errors")
                           .attr("from_status")(Status::CodeName(e.status.code()), std::string(e.status.message()));
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    }
  });
  m.def("engines", [] {
    py::list out;
    for (const auto& i : pmindex::ListIndexes()) {
      py::dict d;
      d["name"] = i.name;
      d["persistent"] = i.persistent;
      d["ordered"] = i.ordered;
      d["concurrent"] = i.concurrent;
      d["description"] = i.description;
      out.append(d);
    }
    return out;
  });
  py::class_<Store>(m, "Store")
      .def(py::init<const std::string&, const std::string&, uint64_t, bool, bool, bool, bool,
                    const std::map<std::string, std::string>&>())
      .def("get", &Store::Get)
      .def("put", &Store::Put)
      .def("remove", &Store::Remove)
      .def("exists", &Store::Exists)
      .def("get_many", &Store::GetMany)
      .def("count", &Store::Count)
      .def("close", &Store::Close)
      .def("stats", &Store::Stats)
      .def_property_readonly("closed", &Store::closed)
      .def_property_readonly("engine", &Store::engine)
      .def_property_readonly("ordered", &Store::ordered)
      .def_property_readonly("u64_keys", &Store::u64_keys)
      .def_property_readonly("u64_values", &Store::u64_values);
  py::class_<Iter>(m, "Iter").def(py::init<py::object>()).def("seek", &Iter::Seek).def("batch", &Iter::Batch);
}
