/*
 * Raw system calls that return -errno instead of setting errno.
 *
 * The resident's per-socket child shares the resident's memory (clone(CLONE_VM), resident.c) and
 * therefore its thread-local errno: a glibc wrapper failing in the child would overwrite errno
 * between a failing call of the resident and the resident reading it. Everything the child runs
 * (netns.c's open/enter/socket path, channel.c's formatting and sending) goes through these
 * instead, and touches nothing but its own stack. On other architectures the wrappers fall back
 * to glibc's syscall() (errno-setting), and the resident falls back to fork() (HELPER_SHARED_VM_CHILD 0).
 */
#ifndef PROBE_AGENT_NETNS_SYS_H
#define PROBE_AGENT_NETNS_SYS_H

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <time.h>

#if defined(__x86_64__)
#define HELPER_SHARED_VM_CHILD 1
static inline long sys_call6(long n, long a1, long a2, long a3, long a4, long a5, long a6) {
  long ret;
  register long r10 __asm__("r10") = a4;
  register long r8 __asm__("r8") = a5;
  register long r9 __asm__("r9") = a6;
  __asm__ __volatile__("syscall"
                       : "=a"(ret)
                       : "a"(n), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8), "r"(r9)
                       : "rcx", "r11", "memory");
  return ret;
}
#elif defined(__aarch64__)
#define HELPER_SHARED_VM_CHILD 1
static inline long sys_call6(long n, long a1, long a2, long a3, long a4, long a5, long a6) {
  register long x8 __asm__("x8") = n;
  register long x0 __asm__("x0") = a1;
  register long x1 __asm__("x1") = a2;
  register long x2 __asm__("x2") = a3;
  register long x3 __asm__("x3") = a4;
  register long x4 __asm__("x4") = a5;
  register long x5 __asm__("x5") = a6;
  __asm__ __volatile__("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory", "cc");
  return x0;
}
#else
#define HELPER_SHARED_VM_CHILD 0
#include <errno.h>
#include <unistd.h>
static inline long sys_call6(long n, long a1, long a2, long a3, long a4, long a5, long a6) {
  long r = syscall(n, a1, a2, a3, a4, a5, a6);
  return r < 0 ? -errno : r;
}
#endif

#define SYS_ARG(x) ((long)(x))

static inline int sys_openat(int dirfd, const char *path, int flags) {
  return (int)sys_call6(SYS_openat, dirfd, SYS_ARG(path), flags, 0, 0, 0);
}
static inline int sys_close(int fd) {
  return (int)sys_call6(SYS_close, fd, 0, 0, 0, 0, 0);
}
static inline int sys_fstat(int fd, struct stat *st) {
  return (int)sys_call6(SYS_fstat, fd, SYS_ARG(st), 0, 0, 0, 0);
}
static inline int sys_fstatfs(int fd, struct statfs *st) {
  return (int)sys_call6(SYS_fstatfs, fd, SYS_ARG(st), 0, 0, 0, 0);
}
#ifndef SYS_close_range
#define SYS_close_range 436 /* the same number on x86_64 and aarch64 (Linux 5.9) */
#endif
static inline int sys_close_range(unsigned first, unsigned last) {
  return (int)sys_call6(SYS_close_range, first, last, 0, 0, 0, 0);
}
static inline long sys_getdents64(int fd, void *buf, size_t cap) {
  return sys_call6(SYS_getdents64, fd, SYS_ARG(buf), SYS_ARG(cap), 0, 0, 0);
}
static inline int sys_prlimit_nofile(struct rlimit *rl) {
  return (int)sys_call6(SYS_prlimit64, 0, RLIMIT_NOFILE, 0, SYS_ARG(rl), 0, 0);
}
/* A /proc/self/fd entry's number, or -1 ("." and ".."). */
static inline long sys_fd_name(const char *name) {
  long v = 0;
  if (*name < '0' || *name > '9') return -1;
  for (; *name >= '0' && *name <= '9' && v < (1L << 31); name++) v = v * 10 + (*name - '0');
  return *name ? -1 : v;
}
/*
 * close_range(first, last) where the kernel has none (Linux < 5.9: ENOSYS) or a seccomp profile
 * refuses it (EPERM, or whatever errno it chose): each open descriptor /proc/self/fd lists, or,
 * without a procfs, every number below RLIMIT_NOFILE. Raw calls and the stack only (child-safe).
 */
static inline int sys_close_span_slow(unsigned first, unsigned last) {
  int dir = sys_openat(AT_FDCWD, "/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    char buf[2048] __attribute__((aligned(8)));
    long n;
    /* Entries come in fd order from a position that is an fd number: closing those read skips none. */
    while ((n = sys_getdents64(dir, buf, sizeof buf)) > 0) {
      for (long off = 0; off < n;) {
        const char *d = buf + off;
        unsigned short reclen;
        __builtin_memcpy(&reclen, d + 16, sizeof reclen);
        long fd = sys_fd_name(d + 19);
        if (fd >= (long)first && fd <= (long)last && fd != dir) sys_close((int)fd);
        off += reclen;
      }
    }
    sys_close(dir);
    return n < 0 ? (int)n : 0;
  }
  struct rlimit rl;
  int e = sys_prlimit_nofile(&rl);
  if (e < 0) return e;
  unsigned long end = rl.rlim_cur < last ? rl.rlim_cur : (unsigned long)last + 1;
  for (unsigned long fd = first; fd < end; fd++) sys_close((int)fd);
  return 0;
}
/* close_range(first, last, 0), or the slow way where there is none; 0 or -errno. */
static inline int sys_close_span(unsigned first, unsigned last) {
  return sys_close_range(first, last) == 0 ? 0 : sys_close_span_slow(first, last);
}
/*
 * Closes every descriptor but 0, 1, 2 and `keep`: what a process must do before it enters a pod's
 * netns, since clone() without CLONE_FILES copies the whole table (queued reply sockets of other
 * pods, the warm resident's home netns, whatever the launcher leaked). 0 or -errno.
 */
static inline int sys_close_all_but(int keep) {
  int e = 0;
  if (keep > 3) e = sys_close_span(3, (unsigned)keep - 1);
  if (e == 0) e = sys_close_span(keep >= 3 ? (unsigned)keep + 1 : 3, ~0U);
  return e;
}
/* The same, keeping two descriptors (a pool worker's channel and its control socket). */
static inline int sys_close_all_but2(int a, int b) {
  int keep[2] = {a < b ? a : b, a < b ? b : a};
  unsigned next = 3;
  for (int i = 0; i < 2; i++) {
    if (keep[i] < (int)next) continue;
    if ((unsigned)keep[i] > next) {
      int e = sys_close_span(next, (unsigned)keep[i] - 1);
      if (e < 0) return e;
    }
    next = (unsigned)keep[i] + 1;
  }
  return sys_close_span(next, ~0U);
}
static inline long sys_readlinkat(int dirfd, const char *path, char *buf, size_t cap) {
  return sys_call6(SYS_readlinkat, dirfd, SYS_ARG(path), SYS_ARG(buf), SYS_ARG(cap), 0, 0);
}
static inline int sys_ioctl(int fd, unsigned long req) {
  return (int)sys_call6(SYS_ioctl, fd, SYS_ARG(req), 0, 0, 0, 0);
}
static inline int sys_setns(int fd, int nstype) {
  return (int)sys_call6(SYS_setns, fd, nstype, 0, 0, 0, 0);
}
static inline int sys_socket(int domain, int type, int protocol) {
  return (int)sys_call6(SYS_socket, domain, type, protocol, 0, 0, 0);
}
static inline long sys_sendmsg(int fd, const struct msghdr *mh, int flags) {
  return sys_call6(SYS_sendmsg, fd, SYS_ARG(mh), flags, 0, 0, 0);
}
static inline long sys_recvmsg(int fd, struct msghdr *mh, int flags) {
  return sys_call6(SYS_recvmsg, fd, SYS_ARG(mh), flags, 0, 0, 0);
}
static inline int sys_ppoll(struct pollfd *fds, nfds_t n, const struct timespec *timeout) {
  /* The kernel's sigset size (8 bytes), not glibc's sigset_t; no mask is passed anyway. */
  return (int)sys_call6(SYS_ppoll, SYS_ARG(fds), SYS_ARG(n), SYS_ARG(timeout), 0, 8, 0);
}
static inline int sys_clock_gettime(clockid_t clock, struct timespec *ts) {
  return (int)sys_call6(SYS_clock_gettime, clock, SYS_ARG(ts), 0, 0, 0, 0);
}
static inline int sys_prctl(int option, unsigned long arg) {
  return (int)sys_call6(SYS_prctl, option, SYS_ARG(arg), 0, 0, 0, 0);
}
static inline int sys_getppid(void) {
  return (int)sys_call6(SYS_getppid, 0, 0, 0, 0, 0, 0);
}

#endif
