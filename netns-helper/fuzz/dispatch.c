/*
 * libFuzzer target: the resident's whole dispatch (line framing, parsing, checks, the reply queue,
 * children started with clone and killed) on a real socketpair channel. Run it where no netns can
 * be reached (`make fuzz-helper`: its own mount and network namespaces, an empty /run/netns, and a
 * proc root that is not a procfs, which every open refuses).
 */
#define _GNU_SOURCE
#include "../helper.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static int peer = -1, chan = -1;
static struct allow_dirs allow;
static struct resident_opts opts = {.max_children = 8, .child_timeout_ms = 2000, .warm = 0};

/* What the agent would read: lines and passed fds, all dropped. */
static void drain_peer(void) {
  char buf[65536];
  union {
    char b[CMSG_SPACE(sizeof(int) * 8)];
    struct cmsghdr align;
  } control;
  for (;;) {
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.b, .msg_controllen = sizeof control.b};
    if (recvmsg(peer, &mh, MSG_DONTWAIT) <= 0) return;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      for (int i = 0; i < n; i++) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        close(fd);
      }
    }
  }
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  int sv[2];
  const char *why = NULL;
  const char *root = "/tmp/pa-fuzz-proc";
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) abort();
  chan = sv[0];
  peer = sv[1];
  if (mkdir(root, 0700) < 0 && errno != EEXIST) abort();
  if (allow_dirs_init(&allow) < 0 || allow_dirs_set_proc_root(&allow, root, &why) < 0) {
    fprintf(stderr, "fuzz-dispatch: %s\n", why ? why : "allow list");
    abort();
  }
  signal(SIGPIPE, SIG_IGN);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  resident_feed_for_fuzzing(chan, &allow, &opts, (const char *)data, size);
  drain_peer();
  return 0;
}
