/*
 * Node's IPC channel, JSON serialisation: one JSON object per line. A handle travels as
 * {"cmd":"NODE_HANDLE","type":"net.Native","msg":...} in the same sendmsg() as an
 * SCM_RIGHTS message carrying exactly that one fd.
 */
#define _GNU_SOURCE
#include "helper.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

/* Writes `in` as the inside of a JSON string; output is always terminated and bounded. */
static size_t json_escape(char *out, size_t cap, const char *in) {
  size_t o = 0;
  for (const unsigned char *c = (const unsigned char *)in; *c && o + 7 < cap; c++) {
    if (*c == '"' || *c == '\\') {
      out[o++] = '\\';
      out[o++] = (char)*c;
    } else if (*c < 0x20 || *c == 0x7f) {
      o += (size_t)snprintf(out + o, cap - o, "\\u%04x", *c);
    } else {
      out[o++] = (char)*c;
    }
  }
  out[o] = '\0';
  return o;
}

size_t format_handle_line(char *buf, size_t cap, uint64_t id) {
  int n = snprintf(buf, cap, "{\"cmd\":\"NODE_HANDLE\",\"type\":\"net.Native\",\"msg\":{\"id\":%" PRIu64 ",\"ok\":true}}\n", id);
  return n < 0 || (size_t)n >= cap ? 0 : (size_t)n;
}

size_t format_error_line(char *buf, size_t cap, uint64_t id, const struct ns_result *r) {
  char msg[sizeof r->msg * 6 + 1];
  json_escape(msg, sizeof msg, r->msg);
  int n = snprintf(buf, cap, "{\"id\":%" PRIu64 ",\"ok\":false,\"stage\":\"%s\",\"errno\":%d,\"code\":\"%s\",\"error\":\"%s\"}\n",
                   id, r->stage, r->err, errno_name(r->err), msg);
  return n < 0 || (size_t)n >= cap ? 0 : (size_t)n;
}

/*
 * One sendmsg: the line plus, when fd >= 0, the fd. Small messages on a unix stream socket
 * are queued as one skb, so writers sharing the channel (children) never interleave.
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
  ssize_t n;
  do {
    n = sendmsg(chan, &mh, flags | MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Sends the whole line (and fd), waiting for room up to timeout_ms. Returns 0 or -1 (errno set). */
int chan_send_wait(int chan, const char *line, size_t len, int fd, int timeout_ms) {
  int64_t deadline = now_ms() + timeout_ms;
  for (;;) {
    ssize_t n = chan_send(chan, line, len, fd, MSG_DONTWAIT);
    if (n == (ssize_t)len) return 0;
    if (n >= 0) {
      /* Never seen for lines this small; a torn line would corrupt the stream for everyone. */
      errno = EPROTO;
      return -1;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    int64_t left = deadline - now_ms();
    if (left <= 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    struct pollfd p = {.fd = chan, .events = POLLOUT};
    if (poll(&p, 1, (int)left) < 0 && errno != EINTR) return -1;
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
