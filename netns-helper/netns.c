/*
 * Validating, opening and entering a netns reference. The rules are mirrored, textually, by
 * agent/netns/path-guard.ts; `--check-paths` lets a test compare the two.
 *
 * Validation (netns_check_path) is pure string work done by the resident itself. Opening and
 * entering (netns_open_checked, netns_socket_checked) run in the resident's shared-VM child, so
 * they use only raw system calls (sys.h), the child-safe text builder (text.c) and their own
 * stack: no errno, no stdio, no locale, no allocation.
 */
#define _GNU_SOURCE
#include "helper.h"
#include "sys.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

/* printf-style: only for the resident and the one-shot modes, never in the shared-VM child. */
void ns_fail(struct ns_result *r, const char *stage, int err, const char *fmt, ...) {
  va_list ap;
  r->stage = stage;
  r->err = err;
  va_start(ap, fmt);
  vsnprintf(r->msg, sizeof r->msg, fmt, ap);
  va_end(ap);
}

/* Child-safe: the message is the concatenation of a, b and c (NULLs skipped). */
void ns_fail_text(struct ns_result *r, const char *stage, int err, const char *a, const char *b, const char *c) {
  struct text t;
  r->stage = stage;
  r->err = err;
  text_init(&t, r->msg, sizeof r->msg);
  if (a) text_str(&t, a);
  if (b) text_str(&t, b);
  if (c) text_str(&t, c);
}

/* Both are table lookups in glibc (no locale, no errno), unlike strerror(). */
const char *errno_name(int err) {
  const char *name = strerrorname_np(err);
  return name ? name : "EUNKNOWN";
}

static const char *errno_text(int err) {
  const char *text = strerrordesc_np(err);
  return text ? text : "Unknown error";
}

void ns_fail_errno(struct ns_result *r, const char *stage, int err) {
  ns_fail_text(r, stage, err, errno_name(err), ": ", errno_text(err));
}

/* Returns why `p` is not an absolute canonical path, or NULL when it is one. */
static const char *canonical_problem(const char *p, size_t max) {
  size_t len = strlen(p);
  if (len == 0) return "path is empty";
  if (p[0] != '/') return "path is not absolute";
  if (len >= max) return "path is too long";
  for (const unsigned char *c = (const unsigned char *)p; *c; c++) {
    if (*c < 0x20 || *c == 0x7f) return "path contains a control character";
  }
  if (len == 1) return NULL;
  if (p[len - 1] == '/') return "path ends with a slash";
  for (const char *s = p + 1;;) {
    const char *e = strchr(s, '/');
    size_t n = e ? (size_t)(e - s) : strlen(s);
    if (n == 0) return "path contains an empty component (//)";
    if ((n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.')) {
      return "path contains a . or .. component";
    }
    if (n > NAME_MAX) return "path component is too long";
    if (!e) return NULL;
    s = e + 1;
  }
}

/* `p` is `dir` or a path below it (both canonical). */
static int path_within(const char *p, const char *dir) {
  size_t n = strlen(dir);
  return strncmp(p, dir, n) == 0 && (p[n] == '\0' || p[n] == '/');
}

static int is_proc_path(const char *p) {
  return path_within(p, "/proc");
}

/* <root>/<pid>/ns/net with a decimal pid as procfs spells it (no sign, no leading zero). */
static int is_proc_netns(const char *p, const char *root) {
  size_t n = strlen(root);
  if (strncmp(p, root, n) != 0 || p[n] != '/') return 0;
  const char *d = p + n + 1;
  size_t digits = 0;
  if (*d < '1' || *d > '9') return 0;
  while (d[digits] >= '0' && d[digits] <= '9') digits++;
  return digits <= 10 && strcmp(d + digits, "/ns/net") == 0;
}

int allow_dirs_init(struct allow_dirs *a) {
  const char *why = NULL;
  a->n = 0;
  strcpy(a->proc_root, "/proc");
  return allow_dirs_add(a, "/run/netns", &why) == 0 && allow_dirs_add(a, "/var/run/netns", &why) == 0 ? 0 : -1;
}

/*
 * Copies a directory flag into `out` (size `cap`) without trailing slashes (harmless in a flag:
 * "/x/" means "/x") and checks it is canonical; returns its length, or -1 with `why` set.
 */
static long normalise_dir_flag(char *out, size_t cap, const char *dir, const char *too_long, const char **why) {
  size_t len = strlen(dir);
  if (len >= cap) {
    *why = too_long;
    return -1;
  }
  memcpy(out, dir, len + 1);
  while (len > 1 && out[len - 1] == '/') out[--len] = '\0';
  const char *problem = canonical_problem(out, cap);
  if (problem) {
    *why = problem;
    return -1;
  }
  return (long)len;
}

int allow_dirs_add(struct allow_dirs *a, const char *dir, const char **why) {
  char tmp[ALLOW_DIR_MAX];
  long n = normalise_dir_flag(tmp, sizeof tmp, dir, "directory path is too long", why);
  if (n < 0) return -1;
  size_t len = (size_t)n;
  if (strcmp(tmp, "/") == 0 || is_proc_path(tmp)) {
    *why = "directory may not be / or under /proc";
    return -1;
  }
  for (size_t i = 0; i < a->n; i++) {
    if (strcmp(a->dirs[i], tmp) == 0) return 0;
  }
  if (a->n >= MAX_ALLOW_DIRS) {
    *why = "too many allowed directories";
    return -1;
  }
  memcpy(a->dirs[a->n++], tmp, len + 1);
  return 0;
}

/*
 * The proc root: / would make every <x>/<pid>/ns/net a magic link we follow, and a root under
 * /proc (say /proc/1/root/proc) would reach another mount namespace's files through a magic link.
 */
int allow_dirs_set_proc_root(struct allow_dirs *a, const char *dir, const char **why) {
  char tmp[PROC_ROOT_MAX];
  long n = normalise_dir_flag(tmp, sizeof tmp, dir, "proc root path is too long", why);
  if (n < 0) return -1;
  size_t len = (size_t)n;
  if (strcmp(tmp, "/") == 0 || (is_proc_path(tmp) && strcmp(tmp, "/proc") != 0)) {
    *why = "proc root may not be / or under /proc";
    return -1;
  }
  memcpy(a->proc_root, tmp, len + 1);
  return 0;
}

/* Index of an allowed directory that is, contains or lies inside the proc root; -1 when none. */
int allow_dirs_overlap(const struct allow_dirs *a) {
  for (size_t i = 0; i < a->n; i++) {
    if (path_within(a->dirs[i], a->proc_root) || path_within(a->proc_root, a->dirs[i])) return (int)i;
  }
  return -1;
}

/*
 * The proc root must be a procfs: <root>/<pid>/ns/net is opened following symlinks, which is
 * only safe where the kernel makes those links. Checked at start (modes that open paths), so a
 * wrong flag fails at once, and again at every open (open_proc_entry).
 */
int proc_root_check_fs(const struct allow_dirs *a, const char **why) {
  struct statfs fs;
  if (statfs(a->proc_root, &fs) < 0) {
    *why = strerror(errno);
    return -1;
  }
  if (fs.f_type != PROC_SUPER_MAGIC) {
    *why = "not a procfs mount";
    return -1;
  }
  return 0;
}

enum path_kind netns_check_path(const char *path, const struct allow_dirs *a, struct ns_result *r, size_t *dir_index) {
  const char *problem = canonical_problem(path, NETNS_PATH_MAX);
  if (problem) {
    ns_fail(r, "validate", EINVAL, "%s", problem);
    return PATH_INVALID;
  }
  const char *root = a->proc_root;
  if (path_within(path, root)) {
    if (is_proc_netns(path, root)) return PATH_PROC;
    ns_fail(r, "validate", EINVAL, "a %s path must be %s/<pid>/ns/net with a decimal pid", root, root);
    return PATH_INVALID;
  }
  if (is_proc_path(path)) {
    /* Only the configured proc root: with a host /proc mounted elsewhere, this one is the wrong pid namespace's. */
    ns_fail(r, "validate", EINVAL, "a /proc path is refused: the proc root is %s", root);
    return PATH_INVALID;
  }
  const char *slash = strrchr(path, '/');
  size_t dir_len = (size_t)(slash - path);
  for (size_t i = 0; i < a->n; i++) {
    if (strlen(a->dirs[i]) == dir_len && strncmp(a->dirs[i], path, dir_len) == 0) {
      if (dir_index) *dir_index = i;
      return PATH_DIR;
    }
  }
  ns_fail(r, "validate", EINVAL, "path is not %s/<pid>/ns/net nor directly inside an allowed directory", root);
  return PATH_INVALID;
}

static const char *file_kind(mode_t m) {
  if (S_ISDIR(m)) return "directory";
  if (S_ISFIFO(m)) return "fifo";
  if (S_ISSOCK(m)) return "socket";
  if (S_ISCHR(m) || S_ISBLK(m)) return "device";
  return "special file";
}

/* "/proc/self/fd/<fd>": the kernel's name for what an fd refers to. */
static void fd_link_path(char *buf, size_t cap, int fd) {
  struct text t;
  text_init(&t, buf, cap);
  text_str(&t, "/proc/self/fd/");
  text_u64(&t, (uint64_t)fd);
}

/*
 * Opens an entry of an allowed directory: the directory itself is resolved (it may be a
 * symlink such as /var/run -> /run), the entry is looked up in it without following a symlink,
 * and nothing but a regular file is opened for real (nsfs bind mounts look regular; a FIFO or
 * device must never be opened). Looking the name up relative to the opened directory makes
 * "the file opened is <realpath(dir)>/<name>" hold by construction, with no /proc readlinks.
 */
static int open_dir_entry(const char *path, const char *dir, struct ns_result *r) {
  int dfd = sys_openat(AT_FDCWD, dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    ns_fail_errno(r, "open", -dfd);
    return -1;
  }
  /* netns_check_path made sure the name is one component, neither . nor .. */
  int pfd = sys_openat(dfd, strrchr(path, '/') + 1, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  sys_close(dfd);
  if (pfd < 0) {
    ns_fail_errno(r, "open", -pfd);
    return -1;
  }
  struct stat st;
  char self[64];
  int fd = -1;
  long e;
  if ((e = sys_fstat(pfd, &st)) < 0) {
    ns_fail_errno(r, "open", (int)-e);
  } else if (S_ISLNK(st.st_mode)) {
    ns_fail_text(r, "validate", EINVAL, "path is a symbolic link", NULL, NULL);
  } else if (!S_ISREG(st.st_mode)) {
    ns_fail_text(r, "nstype", EINVAL, "not a network namespace (a ", file_kind(st.st_mode), ")");
  } else {
    /* Reopening the O_PATH fd through procfs opens exactly the file checked above, no race. */
    fd_link_path(self, sizeof self, pfd);
    fd = sys_openat(AT_FDCWD, self, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
      ns_fail_errno(r, "open", -fd);
      fd = -1;
    }
  }
  sys_close(pfd);
  return fd;
}

/*
 * Opens <proc root>/<pid>/ns/net relative to the proc root, checked to be a procfs at this very
 * open: the <pid>/ns/net links are followed, which is only safe where the kernel makes them, and
 * a mount placed over the root after start would otherwise go unnoticed.
 */
static int open_proc_entry(const char *path, const char *root, struct ns_result *r) {
  int rfd = sys_openat(AT_FDCWD, root, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (rfd < 0) {
    ns_fail_errno(r, "open", -rfd);
    return -1;
  }
  struct statfs fs;
  int e = sys_fstatfs(rfd, &fs);
  if (e < 0 || fs.f_type != PROC_SUPER_MAGIC) {
    sys_close(rfd);
    if (e < 0) ns_fail_errno(r, "open", -e);
    else ns_fail_text(r, "open", EXDEV, "the proc root ", root, " is no longer a procfs mount");
    return -1;
  }
  /* A magic link: following it is the point, and procfs checks ptrace access. */
  int fd = sys_openat(rfd, path + strlen(root) + 1, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  sys_close(rfd);
  if (fd < 0) {
    ns_fail_errno(r, "open", -fd);
    return -1;
  }
  return fd;
}

const char *netns_base_dir(const struct allow_dirs *a, enum path_kind kind, size_t dir_index) {
  return kind == PATH_PROC ? a->proc_root : a->dirs[dir_index];
}

/* Refuses a namespace other than the one the agent checked (a reused pid, a re-mounted file). */
static int check_identity(int fd, const struct ns_identity *want, struct ns_result *r) {
  if (!want || !want->set) return 0;
  struct stat st;
  int e = sys_fstat(fd, &st);
  if (e < 0) {
    ns_fail_errno(r, "identity", -e);
    return -1;
  }
  if ((uint64_t)st.st_dev == want->dev && (uint64_t)st.st_ino == want->ino) return 0;
  struct text t;
  r->stage = "identity";
  r->err = ESTALE;
  text_init(&t, r->msg, sizeof r->msg);
  text_str(&t, "not the network namespace that was checked (dev ");
  text_u64(&t, want->dev);
  text_str(&t, " ino ");
  text_u64(&t, want->ino);
  text_str(&t, "), now dev ");
  text_u64(&t, (uint64_t)st.st_dev);
  text_str(&t, " ino ");
  text_u64(&t, (uint64_t)st.st_ino);
  return -1;
}

int netns_open_checked(const char *path, enum path_kind kind, const char *dir, const struct ns_identity *want, struct ns_result *r) {
  int fd = kind == PATH_PROC ? open_proc_entry(path, dir, r) : open_dir_entry(path, dir, r);
  if (fd < 0) return -1;
  int type = sys_ioctl(fd, NS_GET_NSTYPE);
  if (type < 0) {
    if (type == -ENOTTY) {
      ns_fail_text(r, "nstype", ENOTTY, "not a network namespace (not a namespace file)", NULL, NULL);
    } else {
      ns_fail_errno(r, "nstype", -type);
    }
    sys_close(fd);
    return -1;
  }
  if (type != CLONE_NEWNET) {
    ns_fail_text(r, "nstype", EINVAL, "not a network namespace (another namespace type)", NULL, NULL);
    sys_close(fd);
    return -1;
  }
  if (check_identity(fd, want, r) < 0) {
    sys_close(fd);
    return -1;
  }
  return fd;
}

int family_to_af(int family) {
  return family == 6 ? AF_INET6 : AF_INET;
}

int netns_socket_checked(const char *path, enum path_kind kind, const char *dir, const struct ns_identity *want, int family,
                         struct ns_result *r) {
  int nsfd = netns_open_checked(path, kind, dir, want, r);
  if (nsfd < 0) return -1;
  int e = sys_setns(nsfd, CLONE_NEWNET);
  sys_close(nsfd);
  if (e < 0) {
    ns_fail_errno(r, "setns", -e);
    return -1;
  }
  int s = sys_socket(family_to_af(family), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s < 0) {
    ns_fail_errno(r, "socket", -s);
    return -1;
  }
  return s;
}

int netns_make_socket(const char *path, int family, const struct allow_dirs *a, const struct ns_identity *want, struct ns_result *r) {
  size_t dir_index = 0;
  enum path_kind kind = netns_check_path(path, a, r, &dir_index);
  if (kind == PATH_INVALID) return -1;
  return netns_socket_checked(path, kind, netns_base_dir(a, kind, dir_index), want, family, r);
}
