/*
 * Node's IPC channel, JSON serialisation: one JSON object per line. A handle travels as
 * {"cmd":"NODE_HANDLE","type":"net.Native","msg":...} in the same sendmsg() as an
 * SCM_RIGHTS message carrying exactly that one fd. Formatting and sending are child-safe
 * (text.c, sys.h): the resident's shared-VM child answers through them.
 */
#define _GNU_SOURCE
#include "helper.h"
#include "sys.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

size_t format_handle_line(char *buf, size_t cap, uint64_t id) {
  struct text t;
  text_init(&t, buf, cap);
  text_str(&t, "{\"cmd\":\"NODE_HANDLE\",\"type\":\"net.Native\",\"msg\":{\"id\":");
  text_u64(&t, id);
  text_str(&t, ",\"ok\":true}}\n");
  return t.overflow ? 0 : t.len;
}

size_t format_error_line(char *buf, size_t cap, uint64_t id, const struct ns_result *r) {
  struct text t;
  text_init(&t, buf, cap);
  text_str(&t, "{\"id\":");
  text_u64(&t, id);
  text_str(&t, ",\"ok\":false,\"stage\":\"");
  text_str(&t, r->stage);
  text_str(&t, "\",\"errno\":");
  text_i64(&t, r->err);
  text_str(&t, ",\"code\":\"");
  text_str(&t, errno_name(r->err));
  text_str(&t, "\",\"error\":\"");
  text_json(&t, r->msg);
  text_str(&t, "\"}\n");
  return t.overflow ? 0 : t.len;
}

/*
 * One sendmsg: the line plus, when fd >= 0, the fd. Small messages on a unix stream socket
 * are queued as one skb, so writers sharing the channel (children) never interleave.
 * Returns the bytes sent or -errno.
 */
ssize_t chan_send(int chan, const char *line, size_t len, int fd, int flags) {
  struct iovec iov = {.iov_base = (void *)line, .iov_len = len};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } control;
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  if (fd >= 0) {
    memset(&control, 0, sizeof control);
    mh.msg_control = control.buf;
    mh.msg_controllen = sizeof control.buf;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  }
  long n;
  do {
    n = sys_sendmsg(chan, &mh, flags | MSG_NOSIGNAL);
  } while (n == -EINTR);
  return (ssize_t)n;
}

static int64_t mono_ms(void) {
  struct timespec ts = {0, 0};
  sys_clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Sends the whole line (and fd), waiting for room up to timeout_ms. Returns 0 or -errno. */
int chan_send_wait(int chan, const char *line, size_t len, int fd, int timeout_ms) {
  int64_t deadline = -1;
  for (;;) {
    ssize_t n = chan_send(chan, line, len, fd, MSG_DONTWAIT);
    if (n == (ssize_t)len) return 0;
    /* Never seen for lines this small; a torn line would corrupt the stream for everyone. */
    if (n >= 0) return -EPROTO;
    if (n != -EAGAIN && n != -EWOULDBLOCK) return (int)n;
    /* The clock is read only once the channel is full: the common path is one sendmsg. */
    int64_t now = mono_ms();
    if (deadline < 0) deadline = now + timeout_ms;
    int64_t left = deadline - now;
    if (left <= 0) return -ETIMEDOUT;
    struct pollfd p = {.fd = chan, .events = POLLOUT};
    struct timespec ts = {.tv_sec = (time_t)(left / 1000), .tv_nsec = (long)(left % 1000) * 1000000};
    int e = sys_ppoll(&p, 1, &ts);
    if (e < 0 && e != -EINTR) return e;
  }
}

/* The fd Node put in NODE_CHANNEL_FD, checked to be a socket speaking JSON lines. */
int channel_fd_from_env(const char **why) {
  const char *mode = getenv("NODE_CHANNEL_SERIALIZATION_MODE");
  if (mode && strcmp(mode, "json") != 0) {
    *why = "NODE_CHANNEL_SERIALIZATION_MODE must be json";
    return -1;
  }
  const char *v = getenv("NODE_CHANNEL_FD");
  if (!v || !*v) {
    *why = "NODE_CHANNEL_FD is not set: start me from Node with an 'ipc' stdio entry";
    return -1;
  }
  char *end = NULL;
  errno = 0;
  long fd = strtol(v, &end, 10);
  if (errno || *end || fd < 0 || fd > 65535) {
    *why = "NODE_CHANNEL_FD is not a file descriptor number";
    return -1;
  }
  struct stat st;
  if (fstat((int)fd, &st) < 0 || !S_ISSOCK(st.st_mode)) {
    *why = "NODE_CHANNEL_FD is not an open socket";
    return -1;
  }
  return (int)fd;
}
