/*
 * op "tcp": kubelet's TCP probe done whole in the resident's child, inside the pod's netns:
 * make the socket, connect with the probe's timeout, close, and answer with the outcome. No fd
 * travels to the agent and Node makes no socket, which is most of what a TCP probe cost through
 * the fd-passing route (the handle wrap and ACK, Node's connect and close).
 *
 * Child-safe like netns.c: raw system calls (sys.h), the text builder, its own stack only.
 * The timeout is counted from the moment the socket exists in the netns, so the child's own
 * start (clone, setns) is never charged to the target, as the agent's Deadline.hold() does.
 */
#define _GNU_SOURCE
#include "helper.h"
#include "sys.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>

static int64_t mono_us(void) {
  struct timespec ts = {0, 0};
  sys_clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* 0 when connected, a positive errno when refused/unreachable/..., -1 when the timeout passed. */
static int connect_within(int s, const struct sockaddr_storage *addr, unsigned int alen, int timeout_ms) {
  int e = (int)sys_call6(SYS_connect, s, SYS_ARG(addr), alen, 0, 0, 0);
  if (e == 0) return 0;
  if (e != -EINPROGRESS) return -e;
  int64_t deadline = mono_us() + (int64_t)timeout_ms * 1000;
  for (;;) {
    int64_t left = deadline - mono_us();
    if (left <= 0) return -1;
    struct pollfd p = {.fd = s, .events = POLLOUT};
    struct timespec ts = {.tv_sec = (time_t)(left / 1000000), .tv_nsec = (long)(left % 1000000) * 1000};
    int n = sys_ppoll(&p, 1, &ts);
    if (n == -EINTR || n == 0) continue;
    if (n < 0) return -n;
    int err = 0;
    socklen_t len = sizeof err;
    long g = sys_call6(SYS_getsockopt, s, SOL_SOCKET, SO_ERROR, SYS_ARG(&err), SYS_ARG(&len), 0);
    if (g < 0) return (int)-g;
    return err;
  }
}

size_t netns_tcp_probe_line(char *buf, size_t cap, uint64_t id, const char *path, enum path_kind kind, const char *dir,
                            int family, const struct sockaddr_storage *addr, unsigned int alen, int timeout_ms,
                            struct ns_result *r) {
  int s = netns_socket_checked(path, kind, dir, family, r);
  if (s < 0) return 0;
  int64_t t0 = mono_us();
  int err = connect_within(s, addr, alen, timeout_ms);
  int64_t us = mono_us() - t0;
  /* A plain close (FIN), as the agent's own TCP probe does; the TIME-WAIT stays in the pod's netns. */
  sys_close(s);
  struct text t;
  text_init(&t, buf, cap);
  text_str(&t, "{\"id\":");
  text_u64(&t, id);
  text_str(&t, ",\"ok\":true,\"tcp\":\"");
  text_str(&t, err == 0 ? "connected" : err < 0 ? "timeout" : "error");
  text_str(&t, "\"");
  if (err > 0) {
    text_str(&t, ",\"errno\":");
    text_i64(&t, err);
    text_str(&t, ",\"code\":\"");
    text_str(&t, errno_name(err));
    text_str(&t, "\"");
  }
  text_str(&t, ",\"us\":");
  text_i64(&t, us);
  text_str(&t, "}\n");
  return t.overflow ? 0 : t.len;
}
