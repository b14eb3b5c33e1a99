/*
 * probe-agent-netns-helper entry point: flag parsing and the three modes.
 *   --resident      serve requests from the agent's IPC channel (a shared-VM child per socket)
 *   --once          make one socket, pass it on the IPC channel, exit (per-probe spawn path)
 *   --check-paths   print the path verdict for each stdin line (tests the TS mirror)
 */
#define _GNU_SOURCE
#include "helper.h"
#include "sys.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * The fortify level glibc really applies (the flag alone can be lowered by the compiler or libc),
 * kept in the binary for test/unit/helper-elf.test.ts.
 */
#define HELPER_STR_(x) #x
#define HELPER_STR(x) HELPER_STR_(x)
#ifdef __USE_FORTIFY_LEVEL
__attribute__((used)) static const char FORTIFY_NOTE[] = "probe-agent-netns-helper fortify level " HELPER_STR(__USE_FORTIFY_LEVEL);
#endif

static const char USAGE[] =
    "usage: probe-agent-netns-helper --resident [--allow-dir DIR]... [--proc-root DIR] [--max-children N]\n"
    "                                [--child-timeout-ms MS] [--warm | --pool N]\n"
    "       probe-agent-netns-helper --once --netns PATH --family 4|6 [--id N] [--allow-dir DIR]...\n"
    "                                [--proc-root DIR] [--dev N --ino N]\n"
    "       probe-agent-netns-helper --check-paths [--allow-dir DIR]... [--proc-root DIR]   (paths on stdin)\n"
    "       probe-agent-netns-helper --version\n"
    "A netns is <proc root>/<pid>/ns/net or a file directly inside an allowed directory\n"
    "(/run/netns, /var/run/netns and every --allow-dir); --dev/--ino (or \"dev\",\"ino\" in a request)\n"
    "name the namespace the path must still be. The proc root is /proc unless --proc-root\n"
    "names where the host's procfs is mounted (then /proc paths are refused). The agent starts\n"
    "this program with an 'ipc' stdio entry (NODE_CHANNEL_FD) and receives each socket as a\n"
    "net.Native handle.\n";

static int usage_error(const char *what) {
  fprintf(stderr, "probe-agent-netns-helper: %s\n%s", what, USAGE);
  return 2;
}

static int parse_long(const char *s, long min, long max, long *out) {
  char *end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || !*s || *end || v < min || v > max) return -1;
  *out = v;
  return 0;
}

/* The channel, with every other inherited descriptor but stdio closed (a launcher's leaked pipe). */
static int own_channel(void) {
  const char *why = NULL;
  int chan = channel_fd_from_env(&why);
  if (chan < 0) {
    fprintf(stderr, "probe-agent-netns-helper: %s\n", why);
    return -1;
  }
  int e = sys_close_all_but(chan);
  if (e < 0) {
    fprintf(stderr, "probe-agent-netns-helper: cannot close inherited descriptors: %s\n", strerror(-e));
    return -1;
  }
  return chan;
}

static int run_once(const char *netns, long family, uint64_t id, const struct allow_dirs *a, const struct ns_identity *want) {
  int chan = own_channel();
  if (chan < 0) return 1;
  struct ns_result r = {0};
  int s = netns_make_socket(netns, (int)family, a, want, &r);
  char line[2048];
  size_t len = s >= 0 ? format_handle_line(line, sizeof line, id) : format_error_line(line, sizeof line, id, &r);
  int e = len == 0 ? -EMSGSIZE : chan_send_wait(chan, line, len, s, 2000);
  if (e < 0) {
    fprintf(stderr, "probe-agent-netns-helper: cannot answer on the channel: %s\n", strerror(-e));
    return 1;
  }
  return 0;
}

static int run_check_paths(const struct allow_dirs *a) {
  static char line[NETNS_PATH_MAX + 2];
  while (fgets(line, sizeof line, stdin)) {
    size_t len = strlen(line);
    int whole = len > 0 && line[len - 1] == '\n';
    if (whole) line[--len] = '\0';
    if (!whole && !feof(stdin)) {
      int ch;
      while ((ch = getchar()) != EOF && ch != '\n') {
      }
      puts("invalid\tpath is too long");
      continue;
    }
    struct ns_result r = {0};
    enum path_kind k = netns_check_path(line, a, &r, NULL);
    if (k == PATH_PROC) puts("proc");
    else if (k == PATH_DIR) puts("dir");
    else printf("invalid\t%s\n", r.msg);
  }
  return 0;
}

/*
 * Signal state comes through exec as the launcher left it. A SIGCHLD set to SIG_IGN (or
 * SA_NOCLDWAIT) makes the kernel reap our children behind our back: waitpid() never reports them,
 * a child that died silent is never answered for, its slot is never freed, and a pool worker's
 * pid may be reused by an unrelated process before we signal it. A blocked mask would reach every
 * child and worker. So both start at the kernel's defaults.
 */
static void reset_signals(void) {
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGCHLD, &dfl, NULL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
}

int main(int argc, char **argv) {
  reset_signals();
  struct allow_dirs allow;
  struct resident_opts ro = {.max_children = 128, .child_timeout_ms = 2000, .warm = 0};
  const char *mode = NULL, *netns = NULL;
  long family = 0, v;
  uint64_t id = 0;
  struct ns_identity want = {0};
  int has_dev = 0, has_ino = 0;
  allow_dirs_init(&allow);
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    const char *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(arg, "--resident") || !strcmp(arg, "--once") || !strcmp(arg, "--check-paths")) {
      if (mode) return usage_error("give exactly one mode");
      mode = arg + 2;
    } else if (!strcmp(arg, "--version")) {
      puts("probe-agent-netns-helper " HELPER_VERSION);
      return 0;
    } else if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
      fputs(USAGE, stdout);
      return 0;
    } else if (!strcmp(arg, "--warm")) {
      ro.warm = 1;
    } else if (!val) {
      return usage_error("a flag is missing its value or is unknown");
    } else if (!strcmp(arg, "--allow-dir")) {
      const char *why = NULL;
      if (allow_dirs_add(&allow, val, &why) < 0) {
        fprintf(stderr, "probe-agent-netns-helper: --allow-dir %s: %s\n", val, why);
        return 2;
      }
      i++;
    } else if (!strcmp(arg, "--proc-root")) {
      const char *why = NULL;
      if (allow_dirs_set_proc_root(&allow, val, &why) < 0) {
        fprintf(stderr, "probe-agent-netns-helper: --proc-root %s: %s\n", val, why);
        return 2;
      }
      i++;
    } else if (!strcmp(arg, "--netns")) {
      netns = val;
      i++;
    } else if (!strcmp(arg, "--family")) {
      if (parse_long(val, 4, 6, &family) < 0 || family == 5) return usage_error("--family must be 4 or 6");
      i++;
    } else if (!strcmp(arg, "--id")) {
      if (parse_long(val, 0, LONG_MAX, &v) < 0 || (uint64_t)v > MAX_REQUEST_ID) return usage_error("--id must be a non-negative integer");
      id = (uint64_t)v;
      i++;
    } else if (!strcmp(arg, "--dev") || !strcmp(arg, "--ino")) {
      if (parse_long(val, 0, LONG_MAX, &v) < 0) return usage_error("--dev and --ino must be non-negative integers");
      if (arg[2] == 'd') {
        want.dev = (uint64_t)v;
        has_dev = 1;
      } else {
        want.ino = (uint64_t)v;
        has_ino = 1;
      }
      i++;
    } else if (!strcmp(arg, "--max-children")) {
      if (parse_long(val, 1, 4096, &v) < 0) return usage_error("--max-children must be 1..4096");
      ro.max_children = (int)v;
      i++;
    } else if (!strcmp(arg, "--pool")) {
      if (parse_long(val, 0, POOL_MAX, &v) < 0) return usage_error("--pool must be 0.." HELPER_STR(POOL_MAX));
      ro.pool = (int)v;
      i++;
    } else if (!strcmp(arg, "--child-timeout-ms")) {
      if (parse_long(val, 10, 60000, &v) < 0) return usage_error("--child-timeout-ms must be 10..60000");
      ro.child_timeout_ms = (int)v;
      i++;
    } else {
      return usage_error("unknown flag");
    }
  }
  if (!mode) return usage_error("give a mode");
  if (ro.warm && ro.pool) return usage_error("--warm and --pool exclude each other");
  if (has_dev != has_ino) return usage_error("--dev and --ino go together");
  want.set = has_dev;
  /* Flags come in any order: the proc root and the directories are compared once all are known. */
  int overlap = allow_dirs_overlap(&allow);
  if (overlap >= 0) {
    fprintf(stderr, "probe-agent-netns-helper: --proc-root %s: overlaps the allowed directory %s\n", allow.proc_root, allow.dirs[overlap]);
    return 2;
  }
  if (!strcmp(mode, "check-paths")) return run_check_paths(&allow);
  const char *fs_why = NULL;
  if (proc_root_check_fs(&allow, &fs_why) < 0) {
    fprintf(stderr, "probe-agent-netns-helper: --proc-root %s: %s\n", allow.proc_root, fs_why);
    return 2;
  }
  if (!strcmp(mode, "once")) {
    if (!netns || !family) return usage_error("--once needs --netns and --family");
    return run_once(netns, family, id, &allow, &want);
  }
  int chan = own_channel();
  if (chan < 0) return 1;
  return run_resident(chan, &allow, &ro);
}
