/*
 * probe-agent-netns-helper: makes unconnected TCP sockets inside a network namespace and
 * passes them to the Node agent over its IPC channel (SCM_RIGHTS), speaking Node's JSON
 * IPC framing. Shared declarations of the small modules.
 */
#ifndef PROBE_AGENT_NETNS_HELPER_H
#define PROBE_AGENT_NETNS_HELPER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define HELPER_VERSION "0.1.0"

/* Bounds: a request line, a netns path, the allow list. */
#define MAX_LINE 8192
/* Most pool workers --pool accepts. */
#define POOL_MAX 64
#define NETNS_PATH_MAX 4096
#define ALLOW_DIR_MAX 1024
#define MAX_ALLOW_DIRS 16
/* Short enough that an error message naming it twice fits in ns_result.msg. */
#define PROC_ROOT_MAX 128
/* Ids travel as JSON numbers: keep them exactly representable as a JS number. */
#define MAX_REQUEST_ID 9007199254740991ULL

/*
 * Where a netns may be named: directories whose direct entries may name one, and the proc root
 * (default /proc; e.g. /host/proc in a container) whose <pid>/ns/net entries may.
 */
struct allow_dirs {
  size_t n;
  char dirs[MAX_ALLOW_DIRS][ALLOW_DIR_MAX];
  char proc_root[PROC_ROOT_MAX];
};

/* Why a socket could not be made: the stage that failed, its errno and a message. */
struct ns_result {
  const char *stage; /* validate | open | nstype | identity | setns | socket | netlink | poll | busy | request | child */
  int err;
  char msg[320];
};

enum path_kind { PATH_INVALID = -1, PATH_PROC = 1, PATH_DIR = 2 };

/*
 * The namespace the agent's resolver checked (st_dev, st_ino of the nsfs file): an opened path
 * must still be that one, or a reused pid or a re-mounted file would lead into another pod.
 */
struct ns_identity {
  int set;
  uint64_t dev, ino;
};

/* text.c: bounded text without stdio, locale, errno or allocation (safe in the shared-VM child). */
struct text {
  char *buf;
  size_t cap, len;
  int overflow;
};
void text_init(struct text *t, char *buf, size_t cap);
void text_str(struct text *t, const char *s);
void text_u64(struct text *t, uint64_t v);
void text_i64(struct text *t, int64_t v);
void text_json(struct text *t, const char *s);
void text_base64(struct text *t, const unsigned char *data, size_t len);

/* netns.c. Functions marked child-safe may run in the resident's shared-VM child. */
void ns_fail(struct ns_result *r, const char *stage, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void ns_fail_text(struct ns_result *r, const char *stage, int err, const char *a, const char *b, const char *c); /* child-safe */
void ns_fail_errno(struct ns_result *r, const char *stage, int err); /* child-safe */
const char *errno_name(int err);
int allow_dirs_init(struct allow_dirs *a);
int allow_dirs_add(struct allow_dirs *a, const char *dir, const char **why);
int allow_dirs_set_proc_root(struct allow_dirs *a, const char *dir, const char **why);
int allow_dirs_overlap(const struct allow_dirs *a);
int proc_root_check_fs(const struct allow_dirs *a, const char **why);
enum path_kind netns_check_path(const char *path, const struct allow_dirs *a, struct ns_result *r, size_t *dir_index);
/* The directory a checked path is opened from: its allowed directory, or the proc root. */
const char *netns_base_dir(const struct allow_dirs *a, enum path_kind kind, size_t dir_index);
/*
 * Opens a path netns_check_path accepted (`dir`: netns_base_dir) and checks it is a network
 * namespace and, when `want` is set, that namespace; child-safe.
 */
int netns_open_checked(const char *path, enum path_kind kind, const char *dir, const struct ns_identity *want, struct ns_result *r);
/* Enters the netns for good and makes the socket: only for a process that exits right after; child-safe. */
int netns_socket_checked(const char *path, enum path_kind kind, const char *dir, const struct ns_identity *want, int family, struct ns_result *r);
int netns_make_socket(const char *path, int family, const struct allow_dirs *a, const struct ns_identity *want, struct ns_result *r);
int family_to_af(int family);

/*
 * addrs.c: enters the netns for good (child-safe; the caller exits right after) and formats the
 * answer line {"id":N,"ok":true,"addrs":[...]} with its global and site-scope addresses;
 * 0 with `r` set on failure.
 */
size_t netns_addresses_line(char *buf, size_t cap, uint64_t id, const char *path, enum path_kind kind, const char *dir,
                            const struct ns_identity *want, struct ns_result *r);

/*
 * tcp.c: enters the netns for good (child-safe; the caller exits right after), connects to the
 * first target within timeout_ms (a second one, if given, after stagger_ms or the first's failure:
 * first to connect wins) and formats {"id":N,"ok":true,"tcp":"connected|error|timeout",...};
 * 0 with `r` set when the socket could not be made. With `keep_fd` (op "connect"), the winner is
 * not closed: it comes back there (TCP_NODELAY set, as Go sets it) with the answer wrapped as a
 * NODE_HANDLE line to carry it; -1 there when nothing connected.
 *
 * With `send` too (op "connect" with "send"), the child writes those bytes on the connection and
 * reads what comes back (struct exchange): a byte pipe that knows no protocol, so every rule of
 * the answer stays with the agent's reader. The answer carries "sent" and "data" (base64); the
 * connection still comes back unless the peer ended it ("eof":true) or reset it ("rerr":"E...").
 */
#include <sys/socket.h>
struct tcp_target {
  int family;
  struct sockaddr_storage addr;
  socklen_t alen;
};
/* The most request bytes op "connect" takes in "send" (a probe's HTTP/1.1 request is a few hundred). */
#define SEND_MAX 4096
/* The most answer bytes the child reads before it hands the connection over with them. */
#define EXCHANGE_DATA_MAX 8192
struct exchange {
  const unsigned char *send;
  size_t send_len;
};
size_t netns_tcp_probe_line(char *buf, size_t cap, uint64_t id, const char *path, enum path_kind kind, const char *dir,
                            const struct ns_identity *want, const struct tcp_target *targets, int ntargets, int timeout_ms, int stagger_ms,
                            int *keep_fd, const struct exchange *x, struct ns_result *r);
/* Longest connect timeout op "tcp" accepts (kubelet's timeoutSeconds bound of the agent: 3600 s). */
#define TCP_TIMEOUT_MS_MAX 3600000

/* channel.c. The formatting and sending functions are child-safe and return -errno on failure. */
size_t format_handle_line(char *buf, size_t cap, uint64_t id);
size_t format_error_line(char *buf, size_t cap, uint64_t id, const struct ns_result *r);
ssize_t chan_send(int chan, const char *line, size_t len, int fd, int flags);
int chan_send_wait(int chan, const char *line, size_t len, int fd, int timeout_ms);
int channel_fd_from_env(const char **why);

/* jsonreq.c */
enum request_op { OP_SOCKET = 0, OP_ADDRS = 1, OP_TCP = 2, OP_CONNECT = 3 };
/* Ops that connect in the pod (op "tcp", and op "connect", which hands the connected socket over). */
#define OP_CONNECTS(op) ((op) == OP_TCP || (op) == OP_CONNECT)
struct request {
  int has_id;
  int has_op;
  enum request_op op;
  uint64_t id;
  int has_cmd;
  char cmd[40];
  int has_netns;
  char netns[NETNS_PATH_MAX];
  int has_family;
  long family;
  /* op "tcp" only: the address to connect to and the connect timeout. */
  int has_ip;
  char ip[64];
  int has_port;
  long port;
  int has_timeout;
  long timeout_ms;
  /* op "tcp", optional: a second address (another family) tried after stagger_ms, Happy Eyeballs. */
  int has_ip2;
  char ip2[64];
  long family2;
  long stagger_ms;
  /* op "connect", optional: bytes to write once connected (decoded from base64). */
  int has_send;
  size_t send_len;
  unsigned char send[SEND_MAX];
  /* Optional, together: the namespace the agent checked (see struct ns_identity). */
  int has_dev;
  uint64_t dev;
  int has_ino;
  uint64_t ino;
};
int parse_request(const char *line, size_t len, struct request *req, const char **why);

/* resident.c */
struct resident_opts {
  int max_children;
  int child_timeout_ms;
  int warm;
  /* Long-lived workers serving requests before per-request children (0: none). */
  int pool;
};
int run_resident(int chan, const struct allow_dirs *a, const struct resident_opts *o);
/*
 * The request loop without the process around it (state made on first call), run until every
 * request is settled or `budget_ms` passed (-1): for the dispatch fuzzer, `drain` reading the agent's end.
 */
int resident_feed_for_fuzzing(int chan, const struct allow_dirs *a, const struct resident_opts *o, const char *data, size_t len,
                              void (*drain)(void), int budget_ms);

/* A value a peer sent, for stderr: JSON-escaped (no raw newline can forge a log line), cut at `cap`. */
void log_escaped(const char *what, const char *value);

#endif
