/*
 * op "tcp": kubelet's TCP probe done whole in the resident's child, inside the pod's netns:
 * make the socket, connect with the probe's timeout, close, and answer with the outcome. No fd
 * travels to the agent and Node makes no socket, which is most of what a TCP probe cost through
 * the fd-passing route (the handle wrap and ACK, Node's connect and close).
 *
 * With a second address (Happy Eyeballs over a dual-stack pod) the child does what
 * agent/probe/connect.ts does: the second attempt starts after the stagger or as soon as the
 * first fails, the first to connect wins, and when both fail the first's error is the answer.
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
#include <netinet/tcp.h>
#include <sys/syscall.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>

static int64_t mono_us(void) {
  struct timespec ts = {0, 0};
  sys_clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ppoll for at most `us` microseconds. */
static int poll_us(struct pollfd *p, nfds_t n, int64_t us) {
  struct timespec ts = {.tv_sec = (time_t)(us / 1000000), .tv_nsec = (long)(us % 1000000) * 1000};
  return sys_ppoll(p, n, &ts);
}

/* One connection attempt: its socket while pending, then its errno (0: connected). */
struct attempt {
  int fd;
  int started;
  int done;
  int err;
};

/* Starts a non-blocking connect on `s` (owned from here on); the attempt is done at once when it fails at once. */
static void start_attempt(struct attempt *a, int s, const struct tcp_target *t) {
  a->started = 1;
  a->fd = s;
  if (s < 0) {
    a->done = 1;
    a->err = -s;
    return;
  }
  int e = (int)sys_call6(SYS_connect, s, SYS_ARG(&t->addr), t->alen, 0, 0, 0);
  if (e != -EINPROGRESS) {
    a->done = 1;
    a->err = -e;
    /* Connected at once (loopback may): still pending for the caller, which keeps or closes it. */
    if (e == 0) return;
    sys_close(s);
    a->fd = -1;
  }
}

/* The pending socket's result once it is writable or failed; a connected one stays open when `keep`. */
static void finish_attempt(struct attempt *a, int keep) {
  int err = 0;
  socklen_t len = sizeof err;
  long g = sys_call6(SYS_getsockopt, a->fd, SOL_SOCKET, SO_ERROR, SYS_ARG(&err), SYS_ARG(&len), 0);
  a->done = 1;
  a->err = g < 0 ? (int)-g : err;
  if (keep && a->err == 0) return;
  /* A plain close (FIN), as the agent's own TCP probe does; the TIME-WAIT stays in the pod's netns. */
  sys_close(a->fd);
  a->fd = -1;
}

/*
 * After the answer's first bytes, how long the child waits for more (or for the peer's end) before
 * it hands the connection over with what it has. A probe asks for "Connection: close", so the
 * peer's end usually follows its answer at once, and the answer needs no connection at all.
 */
#define EXCHANGE_QUIET_US 2000

/* What the exchange did: bytes written and read, how it ended, and when the first byte came. */
struct exchange_out {
  size_t sent, got;
  int eof;
  int rerr;
  int64_t first_us;
};

/*
 * Writes x's bytes on the connected non-blocking `fd`, then reads into buf until the peer ends or
 * resets, buf is full, nothing more came for EXCHANGE_QUIET_US after some did, or the deadline.
 * Knows no protocol: a write that does not finish (an error, or no room before the deadline) stops
 * it there, and the agent writes the rest itself and meets the same error.
 */
static void run_exchange(int fd, const struct exchange *x, unsigned char *buf, size_t cap, int64_t t0, int64_t deadline,
                         struct exchange_out *o) {
  *o = (struct exchange_out){.first_us = -1};
  while (o->sent < x->send_len) {
    long n = sys_call6(SYS_sendto, fd, SYS_ARG(x->send + o->sent), SYS_ARG(x->send_len - o->sent), MSG_NOSIGNAL | MSG_DONTWAIT, 0, 0);
    if (n > 0) {
      o->sent += (size_t)n;
      continue;
    }
    if (n == -EINTR) continue;
    int64_t left = deadline - mono_us();
    if (n != -EAGAIN || left <= 0) return;
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int e = poll_us(&p, 1, left);
    if (e < 0 && e != -EINTR) return;
  }
  while (o->got < cap) {
    long n = sys_call6(SYS_recvfrom, fd, SYS_ARG(buf + o->got), SYS_ARG(cap - o->got), MSG_DONTWAIT, 0, 0);
    if (n > 0) {
      if (o->got == 0) o->first_us = mono_us() - t0;
      o->got += (size_t)n;
      continue;
    }
    if (n == 0) {
      o->eof = 1;
      return;
    }
    if (n == -EINTR) continue;
    if (n != -EAGAIN) {
      o->rerr = (int)-n;
      return;
    }
    int64_t now = mono_us();
    int64_t until = deadline;
    if (o->got > 0 && now + EXCHANGE_QUIET_US < until) until = now + EXCHANGE_QUIET_US;
    int64_t left = until - now;
    if (left <= 0) return;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int e = poll_us(&p, 1, left);
    if (e == 0) return;
    if (e < 0 && e != -EINTR) return;
  }
}

size_t netns_tcp_probe_line(char *buf, size_t cap, uint64_t id, const char *path, enum path_kind kind, const char *dir,
                            const struct ns_identity *want, const struct tcp_target *targets, int ntargets, int timeout_ms,
                            int stagger_ms, int *keep_fd, const struct exchange *x, struct ns_result *r) {
  if (keep_fd) *keep_fd = -1;
  int s = netns_socket_checked(path, kind, dir, want, targets[0].family, r);
  if (s < 0) return 0;
  struct attempt at[2] = {{.fd = -1}, {.fd = -1}};
  if (ntargets > 2) ntargets = 2;
  int64_t t0 = mono_us();
  int64_t deadline = t0 + (int64_t)timeout_ms * 1000;
  int64_t stagger_at = t0 + (int64_t)stagger_ms * 1000;
  start_attempt(&at[0], s, &targets[0]);
  int winner = -1;
  for (;;) {
    for (int i = 0; i < ntargets; i++) {
      if (at[i].started && at[i].done && at[i].err == 0 && winner < 0) winner = i;
    }
    if (winner >= 0) break;
    int64_t now = mono_us();
    /* The next address starts after the stagger, or at once when the previous one failed. */
    if (ntargets > 1 && !at[1].started && (at[0].done || now >= stagger_at)) {
      /* We are inside the netns for good: a socket of the other family is one syscall. */
      int s2 = sys_socket(family_to_af(targets[1].family), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      start_attempt(&at[1], s2, &targets[1]);
      continue;
    }
    int all_done = 1;
    for (int i = 0; i < ntargets; i++) all_done &= at[i].started && at[i].done;
    if (all_done) break;
    if (now >= deadline) break;
    int64_t wake = deadline;
    if (ntargets > 1 && !at[1].started && stagger_at < wake) wake = stagger_at;
    struct pollfd p[2];
    int idx[2], n = 0;
    for (int i = 0; i < ntargets; i++) {
      if (at[i].started && !at[i].done) {
        p[n] = (struct pollfd){.fd = at[i].fd, .events = POLLOUT};
        idx[n++] = i;
      }
    }
    int64_t left = wake - now;
    int got = poll_us(p, (nfds_t)n, left);
    if (got < 0 && got != -EINTR) {
      /* Not a state of the target: retrying would only spin until the deadline. */
      for (int i = 0; i < 2; i++) {
        if (at[i].fd >= 0) sys_close(at[i].fd);
      }
      ns_fail_errno(r, "poll", -got);
      return 0;
    }
    if (got <= 0) continue;
    for (int k = 0; k < n; k++) {
      if (p[k].revents) finish_attempt(&at[idx[k]], keep_fd != NULL);
    }
  }
  int64_t us = mono_us() - t0;
  int kept = -1;
  if (keep_fd && winner >= 0) {
    kept = at[winner].fd;
    at[winner].fd = -1;
    int one = 1;
    sys_call6(SYS_setsockopt, kept, IPPROTO_TCP, TCP_NODELAY, SYS_ARG(&one), sizeof one, 0);
  }
  for (int i = 0; i < 2; i++) {
    if (at[i].fd >= 0) sys_close(at[i].fd);
  }
  unsigned char data[EXCHANGE_DATA_MAX];
  struct exchange_out xo = {.first_us = -1};
  int exchanged = kept >= 0 && x != NULL && x->send_len > 0;
  if (exchanged) {
    int64_t t1 = mono_us();
    run_exchange(kept, x, data, sizeof data, t1, deadline, &xo);
    /* An ended connection is of no use to the agent: the answer alone tells it all. */
    if (xo.eof || xo.rerr) {
      sys_close(kept);
      kept = -1;
    }
  }
  struct text t;
  text_init(&t, buf, cap);
  /* The same answer; with a connection to hand over, as the msg of the NODE_HANDLE that carries it. */
  if (kept >= 0) text_str(&t, "{\"cmd\":\"NODE_HANDLE\",\"type\":\"net.Native\",\"msg\":");
  text_str(&t, "{\"id\":");
  text_u64(&t, id);
  text_str(&t, ",\"ok\":true,\"tcp\":\"");
  /* Reported like connect.ts: the winner; else the primary's error, if it has one, before a timeout. */
  int err = at[0].done ? at[0].err : 0;
  if (winner >= 0) {
    text_str(&t, "connected\",\"won\":");
    text_i64(&t, winner);
  } else if (err != 0) {
    text_str(&t, "error\",\"errno\":");
    text_i64(&t, err);
    text_str(&t, ",\"code\":\"");
    text_str(&t, errno_name(err));
    text_str(&t, "\"");
  } else {
    text_str(&t, "timeout\"");
  }
  text_str(&t, ",\"us\":");
  text_i64(&t, us);
  if (exchanged) {
    text_str(&t, ",\"sent\":");
    text_u64(&t, xo.sent);
    text_str(&t, ",\"fbus\":");
    text_i64(&t, xo.first_us);
    text_str(&t, ",\"xus\":");
    text_i64(&t, mono_us() - t0 - us);
    if (xo.eof) text_str(&t, ",\"eof\":true");
    if (xo.rerr) {
      text_str(&t, ",\"rerr\":\"");
      text_str(&t, errno_name(xo.rerr));
      text_str(&t, "\"");
    }
    text_str(&t, ",\"data\":\"");
    text_base64(&t, data, xo.got);
    text_str(&t, "\"");
  }
  text_str(&t, kept >= 0 ? "}}\n" : "}\n");
  if (t.overflow) {
    if (kept >= 0) sys_close(kept);
    return 0;
  }
  if (keep_fd) *keep_fd = kept;
  return t.len;
}
