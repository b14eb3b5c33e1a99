/*
 * fail-syscall [--ignore SIG]... [--block-all] [--fill-fd FD] [NR ERRNO]... PROGRAM [ARG]...
 * Runs PROGRAM as a careless or hostile launcher would leave it, to show how a program meets
 * that: each system call NR failing with ERRNO (a seccomp filter, x86_64 numbers), SIG ignored
 * (SIG_IGN survives exec), every signal blocked (so does the mask), and FD's peer not reading:
 * lines of `{}` sent on FD until the socket's buffer stays full.
 * Built by the tests that use it (gcc, no extra package).
 */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_RULES 8

static int numeric(const char *s) {
  return *s && strspn(s, "0123456789") == strlen(s);
}

/* Sends lines until the buffer stays full: the peer may still be taking some in at first. */
static int fill(int fd) {
  /* One JSON line per send (all of it or EAGAIN: one buffer of a stream socket), 1 KiB: few sends. */
  char line[1024];
  memset(line, ' ', sizeof line);
  memcpy(line, "{}", 2);
  line[sizeof line - 1] = '\n';
  int full_rounds = 0;
  while (full_rounds < 5) {
    int sent = 0;
    while (send(fd, line, sizeof line, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)sizeof line) sent++;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    full_rounds = sent ? 0 : full_rounds + 1;
    nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
  }
  return 0;
}

int main(int argc, char **argv) {
  unsigned nr[MAX_RULES], err[MAX_RULES];
  int rules = 0, i = 1, fill_fd = -1;
  sigset_t block;
  sigemptyset(&block);
  for (; i < argc && !strncmp(argv[i], "--", 2); i++) {
    if (!strcmp(argv[i], "--block-all")) {
      sigfillset(&block);
    } else if (!strcmp(argv[i], "--ignore") && i + 1 < argc) {
      signal(atoi(argv[++i]), SIG_IGN);
    } else if (!strcmp(argv[i], "--fill-fd") && i + 1 < argc) {
      fill_fd = atoi(argv[++i]);
    } else {
      break;
    }
  }
  for (; i + 2 < argc && numeric(argv[i]) && numeric(argv[i + 1]) && rules < MAX_RULES; i += 2, rules++) {
    nr[rules] = (unsigned)atoi(argv[i]);
    err[rules] = (unsigned)atoi(argv[i + 1]);
  }
  if (i >= argc) {
    fprintf(stderr, "usage: fail-syscall [--ignore SIG]... [--block-all] [--fill-fd FD] [NR ERRNO]... PROGRAM [ARG]...\n");
    return 2;
  }
  if (fill_fd >= 0 && fill(fill_fd) < 0) {
    perror("fail-syscall: fill");
    return 1;
  }
  sigprocmask(SIG_SETMASK, &block, NULL);
  if (rules > 0) {
    /* arch check, load nr, then per rule: if nr matches return its errno; else allow. */
    struct sock_filter f[4 + 2 * MAX_RULES + 1];
    int n = 0;
    f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
    f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0);
    f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    for (int r = 0; r < rules; r++) {
      f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr[r], 0, 1);
      f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (err[r] & SECCOMP_RET_DATA));
    }
    f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    struct sock_fprog prog = {.len = (unsigned short)n, .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) < 0) {
      perror("fail-syscall: seccomp");
      return 1;
    }
  }
  execv(argv[i], argv + i);
  perror("fail-syscall: exec");
  return 127;
}
