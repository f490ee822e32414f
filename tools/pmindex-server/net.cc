// net.cc: Server (net.h), libevent accept thread and worker threads. No PM
// access of its own (the Store persists). Thread safety, flow control and
// shutdown order: as net.h describes.
#include "net.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <csignal>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_set>

namespace pmindex::server {

namespace {
constexpr size_t kOutLimit = 4 << 20;
}

struct Conn;

struct Worker {
  ServerState* st = nullptr;
  event_base* base = nullptr;
  event* notify = nullptr;
  std::mutex mu;
  std::vector<int> handoff;  // accepted sockets not yet picked up
  std::unordered_set<Conn*> conns;
  std::thread thread;
};

struct Conn {
  Conn(Worker* w, bufferevent* b) : worker(w), bev(b), proto(w->st) {}
  Worker* worker;
  bufferevent* bev;
  Protocol proto;
  std::string out;
  bool closing = false;
  bool paused = false;
};

namespace {

void FreeConn(Conn* c) {
  bufferevent_free(c->bev);
  c->worker->conns.erase(c);
  c->worker->st->curr_connections.fetch_sub(1, std::memory_order_relaxed);
  delete c;
}

// Runs the connection's pending commands and queues the replies. May free c.
void Drive(Conn* c) {
  c->out.clear();
  bool keep = c->proto.Run(&c->out, kOutLimit);
  evbuffer* output = bufferevent_get_output(c->bev);
  if (!c->out.empty()) {
    evbuffer_add(output, c->out.data(), c->out.size());
    c->worker->st->bytes_written.fetch_add(c->out.size(), std::memory_order_relaxed);
  }
  if (c->out.capacity() > kOutLimit) std::string().swap(c->out);
  if (!keep) {
    c->closing = true;
    bufferevent_disable(c->bev, EV_READ);
    if (evbuffer_get_length(output) == 0) FreeConn(c);
    return;
  }
  if (c->proto.pending() || evbuffer_get_length(output) > kOutLimit) {
    c->paused = true;
    bufferevent_disable(c->bev, EV_READ);
  }
}

void OnRead(bufferevent* bev, void* arg) {
  Conn* c = static_cast<Conn*>(arg);
  evbuffer* input = bufferevent_get_input(bev);
  size_t n = evbuffer_get_length(input);
  std::string& in = c->proto.input();
  size_t old = in.size();
  in.resize(old + n);
  evbuffer_remove(input, in.data() + old, n);
  Drive(c);
}

void OnWrite(bufferevent*, void* arg) {  // the output buffer is empty
  Conn* c = static_cast<Conn*>(arg);
  if (c->closing) return FreeConn(c);
  if (c->paused) {
    c->paused = false;
    bufferevent_enable(c->bev, EV_READ);
    Drive(c);
  }
}

void OnEvent(bufferevent*, short what, void* arg) {
  if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) FreeConn(static_cast<Conn*>(arg));
}

void OnHandoff(evutil_socket_t, short, void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  std::vector<int> fds;
  {
    std::lock_guard<std::mutex> g(w->mu);
    fds.swap(w->handoff);
  }
  for (int fd : fds) {
    bufferevent* bev = bufferevent_socket_new(w->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (bev == nullptr) {
      close(fd);
      w->st->curr_connections.fetch_sub(1, std::memory_order_relaxed);
      continue;
    }
    Conn* c = new Conn(w, bev);
    w->conns.insert(c);
    bufferevent_setcb(bev, OnRead, OnWrite, OnEvent, c);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
  }
}

}  // namespace

Server::Server(ServerState* state, NetConfig config) : st_(state), cfg_(std::move(config)) {}

Server::~Server() { Stop(); }

Status Server::Start(std::string* bound) {
  evthread_use_pthreads();
  std::signal(SIGPIPE, SIG_IGN);
  base_ = event_base_new();
  if (base_ == nullptr) return Status::IOError("event_base_new failed");
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  std::string port = std::to_string(cfg_.port);
  int rc = getaddrinfo(cfg_.listen.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) return Status::InvalidArgument("listen address " + cfg_.listen + ": " + gai_strerror(rc));
  listener_ = evconnlistener_new_bind(base_, OnAccept, this, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 1024,
                                      res->ai_addr, int(res->ai_addrlen));
  freeaddrinfo(res);
  if (listener_ == nullptr)
    return Status::IOError("cannot listen on " + cfg_.listen + ":" + port + ": " + std::strerror(errno));
  sockaddr_storage ss{};
  socklen_t sl = sizeof ss;
  getsockname(evconnlistener_get_fd(listener_), reinterpret_cast<sockaddr*>(&ss), &sl);
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  getnameinfo(reinterpret_cast<sockaddr*>(&ss), sl, host, sizeof host, serv, sizeof serv,
              NI_NUMERICHOST | NI_NUMERICSERV);
  *bound = std::string(host) + ":" + serv;
  resume_ = evtimer_new(base_, OnResume, this);
  evconnlistener_set_error_cb(listener_, OnAcceptError);
  sigterm_ = evsignal_new(base_, SIGTERM, OnSignal, base_);
  sigint_ = evsignal_new(base_, SIGINT, OnSignal, base_);
  event_add(sigterm_, nullptr);
  event_add(sigint_, nullptr);
  for (int i = 0; i < cfg_.threads; i++) {
    auto w = std::make_unique<Worker>();
    w->st = st_;
    w->base = event_base_new();
    if (w->base == nullptr) return Status::IOError("event_base_new failed");
    w->notify = event_new(w->base, -1, EV_PERSIST, OnHandoff, w.get());
    event_add(w->notify, nullptr);
    Worker* raw = w.get();
    w->thread = std::thread([raw] { event_base_loop(raw->base, EVLOOP_NO_EXIT_ON_EMPTY); });
    workers_.push_back(std::move(w));
  }
  return Status::OK();
}

void Server::OnSignal(int, short, void* arg) { event_base_loopbreak(static_cast<event_base*>(arg)); }

// accept failed (EMFILE, ENFILE ...): stop accepting for 100 ms instead of
// spinning on a listening socket that stays readable, as memcached does.
void Server::OnAcceptError(evconnlistener* l, void* arg) {
  Server* s = static_cast<Server*>(arg);
  evconnlistener_disable(l);
  timeval tv{0, 100000};
  event_add(s->resume_, &tv);
}

void Server::OnResume(int, short, void* arg) {
  Server* s = static_cast<Server*>(arg);
  if (s->listener_ != nullptr) evconnlistener_enable(s->listener_);
}

void Server::OnAccept(evconnlistener*, int fd, sockaddr*, int, void* arg) {
  Server* s = static_cast<Server*>(arg);
  ServerState* st = s->st_;
  if (st->curr_connections.load(std::memory_order_relaxed) >= st->max_connections) {
    static const char kMsg[] = "ERROR Too many open connections\r\n";
    [[maybe_unused]] ssize_t n = send(fd, kMsg, sizeof kMsg - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    close(fd);
    st->rejected_connections.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  st->curr_connections.fetch_add(1, std::memory_order_relaxed);
  st->total_connections.fetch_add(1, std::memory_order_relaxed);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  Worker* w = s->workers_[s->next_++ % s->workers_.size()].get();
  {
    std::lock_guard<std::mutex> g(w->mu);
    w->handoff.push_back(fd);
  }
  event_active(w->notify, EV_READ, 0);
}

void Server::Run() { event_base_dispatch(base_); }

void Server::Stop() {
  if (listener_ != nullptr) evconnlistener_free(listener_);
  listener_ = nullptr;
  for (auto& w : workers_) event_base_loopbreak(w->base);
  for (auto& w : workers_) {
    if (w->thread.joinable()) w->thread.join();
    OnHandoff(-1, 0, w.get());  // sockets handed over but not picked up
    while (!w->conns.empty()) FreeConn(*w->conns.begin());
    event_free(w->notify);
    event_base_free(w->base);
  }
  workers_.clear();
  if (resume_ != nullptr) event_free(resume_);
  resume_ = nullptr;
  if (sigterm_ != nullptr) event_free(sigterm_);
  if (sigint_ != nullptr) event_free(sigint_);
  sigterm_ = sigint_ = nullptr;
  if (base_ != nullptr) event_base_free(base_);
  base_ = nullptr;
}

}  // namespace pmindex::server
