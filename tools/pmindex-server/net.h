// net.h: the network side of pmindex-server, built on libevent as
// memcached is: one accept thread (the caller of Run) with an evconnlistener,
// and N worker threads, each with its own event_base serving the
// connections handed to it round robin. A connection lives on one worker
// for its whole life; its Protocol (protocol.h) runs on that worker only.
//
// Flow control: a worker appends replies to the socket's output buffer and
// stops reading from a connection whose output holds more than 4 MiB
// unsent, resuming when the client has drained it, so a client that
// pipelines requests without reading replies cannot grow the server's
// memory without bound. A command line has kMaxLine bytes at most; a data
// block at most the item limit plus 2.
//
// Connection limit: beyond max_connections an accepted socket receives
// "ERROR Too many open connections" and is closed, as memcached does. When
// accept itself fails (out of file descriptors), accepting pauses for 100 ms.
//
// Shutdown: Stop (from the accept thread, after Run returned on SIGTERM or
// SIGINT) frees the listener, breaks every worker's loop (a callback that is
// running completes first, so a command being served finishes and its reply
// is queued), joins the workers and closes their connections. The store is
// closed by the caller afterwards.
//
// Thread safety: Start, Run and Stop from one thread (main). Workers touch
// only their own base and connections, plus the shared ServerState atomics
// and the Store (thread-safe). The handoff queue of a worker is guarded by
// its mutex.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "protocol.h"

struct event_base;
struct evconnlistener;
struct event;
struct sockaddr;

namespace pmindex::server {

struct NetConfig {
  std::string listen = "127.0.0.1";
  int port = 11211;  // 0: any free port (the bound one is reported)
  int threads = 4;
};

struct Worker;

class Server {
 public:
  Server(ServerState* state, NetConfig config);
  ~Server();
  // Binds and starts the workers; *bound receives "addr:port".
  Status Start(std::string* bound);
  // Serves until SIGTERM or SIGINT.
  void Run();
  void Stop();

 private:
  static void OnAccept(evconnlistener* l, int fd, ::sockaddr* addr, int len, void* arg);
  static void OnSignal(int sig, short what, void* arg);
  static void OnAcceptError(evconnlistener* l, void* arg);
  static void OnResume(int fd, short what, void* arg);

  ServerState* st_;
  NetConfig cfg_;
  event_base* base_ = nullptr;
  evconnlistener* listener_ = nullptr;
  event* sigterm_ = nullptr;
  event* sigint_ = nullptr;
  event* resume_ = nullptr;  // re-enables accepting after an accept error
  std::vector<std::unique_ptr<Worker>> workers_;
  size_t next_ = 0;
};

}  // namespace pmindex::server
