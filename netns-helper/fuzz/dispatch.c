/*
 * libFuzzer target: the resident's whole dispatch (line framing, parsing, checks, the reply queue,
 * the pool's workers and the children started with clone) on a real socketpair channel, run until
 * every request is settled. Run it in private mount, network and pid namespaces (`make
 * fuzz-helper`, fuzz/run.sh): /run/netns then holds only the namespaces run.sh made there (fz0,
 * with a listener on 127.0.0.1:7777, and fz1), /proc shows only this process and its own, and no
 * address leads out, so opens, setns, identity checks, sockets and connects succeed and fail for
 * real without reaching anything else.
 *
 * Invariants checked after each input (abort, so libFuzzer keeps the input):
 *   - every request line is answered exactly once: the ids of the answers are the ids of the lines
 *     the resident must answer (parse_request decides, as the resident does);
 *   - no descriptor is left behind in this process (the resident), and an idle worker holds only
 *     its own (checked in resident.c).
 */
#define _GNU_SOURCE
#include "../helper.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_IDS 8192
#define LISTEN_PORT 7777
/* Longest an input may take to settle; a slower one is not checked (the machine may be loaded). */
#define BUDGET_MS 10000

static int peer = -1, chan = -1, listener = -1;
static struct allow_dirs allow;
static struct resident_opts opts = {.max_children = 8, .child_timeout_ms = 2000, .warm = 0, .pool = 2};

/* What the agent read: answer ids, and a line being assembled across reads. */
static uint64_t got[MAX_IDS];
static size_t ngot;
static char partial[MAX_LINE * 2];
static size_t npartial;

/* The id an answer line names (plain, or a NODE_HANDLE's msg); none for the helper's events. */
static void note_answer(const char *line, size_t len) {
  const char *p = memmem(line, len, "\"id\":", 5);
  if (!p || memmem(line, len, "\"event\":", 8)) return;
  if (ngot == MAX_IDS) abort();
  got[ngot++] = strtoull(p + 5, NULL, 10);
}

/* Reads what the resident and its children sent: lines (ids noted) and passed fds (closed). */
static void drain_peer(void) {
  char buf[65536];
  union {
    char b[CMSG_SPACE(sizeof(int) * 8)];
    struct cmsghdr align;
  } control;
  for (;;) {
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.b, .msg_controllen = sizeof control.b};
    ssize_t n = recvmsg(peer, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n <= 0) break;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      for (int i = 0; i < k; i++) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        close(fd);
      }
    }
    for (ssize_t i = 0; i < n; i++) {
      if (buf[i] == '\n') {
        note_answer(partial, npartial);
        npartial = 0;
      } else if (npartial < sizeof partial) {
        partial[npartial++] = buf[i];
      }
    }
  }
  /* Connections the children made to the listener: accepted and closed, so its backlog never fills. */
  for (int fd; listener >= 0 && (fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC)) >= 0;) close(fd);
}

/* Whether the resident must answer a line of `len` bytes (its framing: longer than MAX_LINE - 1 is cut). */
static int expects_answer(const char *line, size_t len, uint64_t *id) {
  static struct request req;
  const char *why = NULL;
  /* Parsed or not: a line naming an id is answered (a refusal at least), Node's cmd lines are not. */
  (void)parse_request(line, len < MAX_LINE ? len : MAX_LINE, &req, &why);
  *id = req.id;
  return req.has_id && !req.has_cmd;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int count_fds(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) abort();
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* A listener on 127.0.0.1:LISTEN_PORT inside /run/netns/fz0, when run.sh made it (else none). */
static void listen_in_fz0(void) {
  int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  int ns = open("/run/netns/fz0", O_RDONLY | O_CLOEXEC);
  if (home < 0 || ns < 0 || setns(ns, CLONE_NEWNET) < 0) {
    fprintf(stderr, "fuzz-dispatch: no /run/netns/fz0: connects will not succeed\n");
  } else {
    listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(LISTEN_PORT), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (listener < 0 || bind(listener, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(listener, 256) < 0) abort();
    if (setns(home, CLONE_NEWNET) < 0) abort();
  }
  if (ns >= 0) close(ns);
  if (home >= 0) close(home);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) abort();
  chan = sv[0];
  peer = sv[1];
  if (allow_dirs_init(&allow) < 0) abort();
  signal(SIGPIPE, SIG_IGN);
  listen_in_fz0();
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static uint64_t want[MAX_IDS];
  size_t nwant = 0;
  const char *p = (const char *)data, *end = p + size;
  /* Complete lines are answered by their rules; an unterminated tail only when it is over-long. */
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t len = (size_t)((nl ? nl : end) - p);
    uint64_t id;
    if ((nl || len >= MAX_LINE) && expects_answer(p, len, &id)) {
      if (nwant == MAX_IDS) abort();
      want[nwant++] = id;
    }
    p += len + (nl != NULL);
  }
  int fds = count_fds();
  ngot = npartial = 0;
  int settled = resident_feed_for_fuzzing(chan, &allow, &opts, (const char *)data, size, drain_peer, BUDGET_MS);
  if (count_fds() != fds) {
    fprintf(stderr, "fuzz-dispatch: %d descriptors before the input, %d after\n", fds, count_fds());
    abort();
  }
  if (settled < 0) return 0;
  qsort(want, nwant, sizeof *want, cmp_u64);
  qsort(got, ngot, sizeof *got, cmp_u64);
  if (nwant != ngot || memcmp(want, got, nwant * sizeof *want) != 0) {
    fprintf(stderr, "fuzz-dispatch: %zu requests to answer, %zu answers, not the same ids\n", nwant, ngot);
    abort();
  }
  return 0;
}
