/*
 * The resident helper: reads requests from the agent's IPC channel and, for each, starts a
 * short-lived child that enters the netns, makes the socket and sends it straight to the
 * agent. The resident itself never enters a netns (unless --warm), never connects, reaps
 * every child, bounds their number and their lifetime, and exits when the agent goes away.
 *
 * The child is a clone(CLONE_VM) of the resident, not a fork(): no page tables to copy or tear
 * down, which was most of the per-socket cost. It is still a process of its own (own fd table,
 * own netns, killable, reaped through SIGCHLD), and the resident does not wait for it, so a
 * child stuck in the kernel stalls nothing but its own request. Sharing the memory is safe
 * because the child touches only its own stack and job (a block the resident does not reuse
 * until the child is reaped) and reads the allow list, which never changes after start; it
 * calls only raw system calls (sys.h: glibc's wrappers would write the resident's errno) and
 * the child-safe parts of netns.c, channel.c and text.c: no stdio, locale, locks or malloc.
 *
 * --pool N: up to N long-lived workers (fork()ed on demand, own memory) serve requests first, one
 * at a time each, returning to the home netns after each. A request finding every worker busy waits
 * in a short FIFO for the next free one, but at most QUEUE_WAIT_MS: then (or when the FIFO is full)
 * it gets a per-request child as above, so a stuck worker delays no other request by more than
 * that. A worker past its request's deadline is killed, answered for, and replaced by the next
 * request that needs one.
 */
#define _GNU_SOURCE
#include "helper.h"
#include "sys.h"

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#define OUT_LINE_MAX 1024
/* An address list: about 90 IPv6 addresses; the child's stack holds it (see CHILD_STACK_BYTES). */
#define ADDRS_LINE_MAX 4096
/*
 * The child's deepest frame (open_dir_entry) holds about 13 KiB of path buffers, under op
 * "connect"'s answer and read buffers (about 21 KiB); the rest is margin. Only the pages a child touches become resident, and blocks are reused LIFO.
 */
#define CHILD_STACK_BYTES (96 * 1024)
/*
 * Longest a request waits for a busy pool worker before it takes a child instead: a worker serves
 * a socket in tens of microseconds, so this is only ever reached when workers are stuck (or the
 * node is very loaded), and bounds what that costs everyone else.
 */
#define QUEUE_WAIT_MS 10
/* Requests that may wait for a worker, per worker. */
#define QUEUE_PER_WORKER 4
/*
 * Workers one pod (one netns) may hold at once: a quarter of the pool, at least one. Its other
 * requests take children at once, so a pod whose targets hang holds no more of the pool than that.
 */
#define POOL_PER_POD(pool) ((pool) / 4 > 0 ? (pool) / 4 : 1)
/* Longest wait before a child that exited is reaped (and answered for, if it did not answer). */
#define REAP_INTERVAL_MS 20

/* Which pod a request is for: the namespace's identity when the agent sent one, else its path's hash. */
struct pod_key {
  uint64_t dev, ino;
};

/* What one child works on: written before clone(), read-only for the child, kept until it is reaped. */
struct child_job {
  uint64_t id;
  enum request_op op;
  int family;
  enum path_kind kind;
  const char *dir; /* an entry of the allow list (never changes after start) */
  int chan;
  int timeout_ms;
  pid_t parent;
  /* op "tcp": where to connect and for how long (parsed by the resident: inet_pton is not child-safe). */
  struct tcp_target targets[2];
  int ntargets;
  int connect_timeout_ms;
  int stagger_ms;
  /* op "connect" with "send": the bytes to write once connected. */
  size_t send_len;
  unsigned char send[SEND_MAX];
  struct ns_identity want;
  struct pod_key pod;
  char netns[NETNS_PATH_MAX];
};

struct child_slot {
  pid_t pid;
  uint64_t id;
  int64_t started_ms;
  /* Lifetime beyond --child-timeout-ms: an op "tcp" child may wait its connect timeout on top. */
  int64_t extra_ms;
  int killed;
  int block;
};

/* A pool worker: its end of a SOCK_SEQPACKET pair takes jobs and answers "done" after each. */
struct worker {
  pid_t pid; /* 0: the slot is empty */
  /* A pidfd (Linux >= 5.3) signals this process only, even once reaped behind our back; -1: none. */
  int pidfd;
  int ctl;
  int busy;
  /* The job's op and pod, while busy. */
  enum request_op op;
  struct pod_key pod;
  uint64_t id;
  int64_t started_ms;
  int64_t extra_ms;
  int killed;
};

/* The resident's own replies wait here when the channel is full; each may own one fd. */
struct out_entry {
  char line[OUT_LINE_MAX];
  size_t len;
  int fd;
};

struct resident {
  int chan;
  const struct allow_dirs *allow;
  const struct resident_opts *opts;
  pid_t self;
  int home_netns;
  struct child_slot *children;
  int nchildren;
  struct worker *workers;
  int nworkers, nbusy;
  /* Jobs waiting for a worker (FIFO), and when each came. */
  struct child_job *queue;
  int64_t *queued_ms;
  int q_head, q_count, q_cap;
  /* Child blocks: [guard page][stack][job], mapped on first use, at most max_children, never unmapped. */
  char **blocks;
  int *free_blocks;
  int nfree, nblocks;
  size_t block_bytes, page;
  struct out_entry *outq;
  size_t out_cap, out_head, out_count;
};

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434 /* the same number on x86_64 and aarch64 (Linux 5.3) */
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

/*
 * SIGKILLs a process of ours that we have not reaped: through its pidfd when there is one, so a pid
 * the kernel reaped and gave to another process is never hit; else by pid, which only our own
 * waitpid() frees (SIGCHLD is at its default, main.c).
 */
static void kill_own(pid_t pid, int pidfd) {
  if (pidfd >= 0) syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
  else kill(pid, SIGKILL);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void flush_outq(struct resident *rs) {
  while (rs->out_count > 0) {
    struct out_entry *e = &rs->outq[rs->out_head];
    ssize_t n = chan_send(rs->chan, e->line, e->len, e->fd, MSG_DONTWAIT);
    if (n == -EAGAIN || n == -EWOULDBLOCK) return;
    if (n < 0) fprintf(stderr, "probe-agent-netns-helper: dropping a reply: %s\n", strerror((int)-n));
    if (e->fd >= 0) close(e->fd);
    rs->out_head = (rs->out_head + 1) % rs->out_cap;
    rs->out_count--;
  }
}

/* Queues one reply (taking ownership of fd) and sends what the channel accepts now. */
static void reply(struct resident *rs, const char *line, size_t len, int fd) {
  if (len == 0 || len > OUT_LINE_MAX || rs->out_count == rs->out_cap) {
    fprintf(stderr, "probe-agent-netns-helper: dropping a reply: %s\n", len ? "agent is not reading" : "reply too long");
    if (fd >= 0) close(fd);
    return;
  }
  struct out_entry *e = &rs->outq[(rs->out_head + rs->out_count) % rs->out_cap];
  memcpy(e->line, line, len);
  e->len = len;
  e->fd = fd;
  rs->out_count++;
  flush_outq(rs);
}

static void reply_error(struct resident *rs, uint64_t id, const struct ns_result *r) {
  char line[OUT_LINE_MAX];
  reply(rs, line, format_error_line(line, sizeof line, id, r), -1);
}

static struct child_job *job_of(const struct resident *rs, int block) {
  return (struct child_job *)(rs->blocks[block] + rs->block_bytes - sizeof(struct child_job));
}

/* A free child block, mapping a new one when none is free; -1 with errno set when mapping fails. */
static int take_block(struct resident *rs) {
  if (rs->nfree > 0) return rs->free_blocks[--rs->nfree];
  if (rs->nblocks >= rs->opts->max_children) {
    errno = EAGAIN;
    return -1;
  }
  char *b = mmap(NULL, rs->block_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (b == MAP_FAILED) return -1;
  /* A child overrunning its stack dies of SIGSEGV here instead of writing into its neighbour. */
  if (mprotect(b, rs->page, PROT_NONE) < 0) {
    int e = errno;
    munmap(b, rs->block_bytes);
    errno = e;
    return -1;
  }
  rs->blocks[rs->nblocks] = b;
  return rs->nblocks++;
}

/*
 * The request's work and its answer on the channel, closing whatever it made; 0 once answered.
 * Child-safe: it runs in the shared-VM child and in a pool worker. It enters the netns and stays.
 */
static int serve_job(const struct child_job *job) {
  struct ns_result r = {0};
  if (job->op == OP_ADDRS) {
    /* A plain line (no fd); a netns's address list can be longer than a socket's answer. */
    char line[ADDRS_LINE_MAX];
    size_t len = netns_addresses_line(line, sizeof line, job->id, job->netns, job->kind, job->dir, &job->want, &r);
    if (len == 0) len = format_error_line(line, sizeof line, job->id, &r);
    return len > 0 && chan_send_wait(job->chan, line, len, -1, job->timeout_ms) == 0 ? 0 : 3;
  }
  if (OP_CONNECTS(job->op)) {
    /* Room for an exchange's answer bytes in base64. */
    char line[OUT_LINE_MAX + (EXCHANGE_DATA_MAX + 2) / 3 * 4];
    int kept = -1;
    struct exchange x = {.send = job->send, .send_len = job->send_len};
    size_t len = netns_tcp_probe_line(line, sizeof line, job->id, job->netns, job->kind, job->dir, &job->want, job->targets, job->ntargets,
                                      job->connect_timeout_ms, job->stagger_ms, job->op == OP_CONNECT ? &kept : NULL, &x, &r);
    if (len == 0) len = format_error_line(line, sizeof line, job->id, &r);
    int e = len > 0 ? chan_send_wait(job->chan, line, len, kept, job->timeout_ms) : -EMSGSIZE;
    /* As for a socket: the agent holds its own copy now, and a worker must not keep a pod's connection. */
    if (kept >= 0) sys_close(kept);
    return e == 0 ? 0 : 3;
  }
  int s = netns_socket_checked(job->netns, job->kind, job->dir, &job->want, job->family, &r);
  char line[OUT_LINE_MAX];
  size_t len = s >= 0 ? format_handle_line(line, sizeof line, job->id) : format_error_line(line, sizeof line, job->id, &r);
  int e = len > 0 ? chan_send_wait(job->chan, line, len, s, job->timeout_ms) : -EMSGSIZE;
  /* The agent holds its own copy now (SCM_RIGHTS); a worker must not keep a pod's socket. */
  if (s >= 0) sys_close(s);
  return e == 0 ? 0 : 3;
}

/*
 * The child: enter, make, send, exit (its return value is the exit status). It shares the
 * resident's memory: see the top of this file for what it may touch.
 */
static int child_main(void *arg) {
  const struct child_job *job = arg;
  struct ns_result r = {0};
  /*
   * First: this fd table is a copy of the resident's, with other requests' sockets waiting in its
   * reply queue, the pool's control sockets and (--warm) its home netns. None of that may follow
   * this child into a pod.
   */
  int closed = sys_close_all_but(job->chan);
  if (closed < 0) {
    char line[OUT_LINE_MAX];
    ns_fail_text(&r, "fork", -closed, "cannot close the descriptors a child inherits: ", errno_name(-closed), NULL);
    size_t len = format_error_line(line, sizeof line, job->id, &r);
    return len > 0 && chan_send_wait(job->chan, line, len, -1, job->timeout_ms) == 0 ? 0 : 3;
  }
  /* Dies with the resident; the check closes the race with a resident that died already. */
  sys_prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (sys_getppid() != job->parent) return 4;
  return serve_job(job);
}

/*
 * A pool worker (a fork(): memory of its own): takes one job at a time from `ctl`, serves it,
 * goes back to the home netns and says "done". It holds only stdio, the channel, `ctl` and its
 * home netns between jobs: a job's netns fd and socket are closed before "done".
 */
__attribute__((noreturn)) static void worker_main(const struct resident *rs, int ctl) {
  /* Other requests' queued sockets, other workers' control sockets: none of it comes along. */
  if (sys_close_all_but2(rs->chan, ctl) < 0) _exit(3);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != rs->self) _exit(4);
  int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (home < 0) _exit(5);
  static struct child_job job;
  for (;;) {
    ssize_t n = recv(ctl, &job, sizeof job, 0);
    if (n == 0) _exit(0);
    if (n < 0) {
      if (errno == EINTR) continue;
      _exit(6);
    }
    size_t head = offsetof(struct child_job, netns);
    if ((size_t)n <= head || job.netns[(size_t)n - head - 1] != '\0') _exit(7);
    int e = serve_job(&job);
    /* Every later job would start in the wrong netns: die, the resident answers and replaces us. */
    if (setns(home, CLONE_NEWNET) < 0) _exit(70);
    if (e != 0) _exit(3);
    if (send(ctl, "d", 1, MSG_NOSIGNAL) != 1) _exit(8);
  }
}

static void reap(struct resident *rs);

/* The sockaddr of `ip` and `port` in `family`; -1 when they do not make one. */
static int tcp_target(long family, const char *ip, long port, struct tcp_target *t) {
  memset(t, 0, sizeof *t);
  t->family = (int)family;
  if (family == 4) {
    struct sockaddr_in *a = (struct sockaddr_in *)&t->addr;
    if (inet_pton(AF_INET, ip, &a->sin_addr) != 1) return -1;
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    t->alen = sizeof *a;
    return 0;
  }
  if (family == 6) {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&t->addr;
    if (inet_pton(AF_INET6, ip, &a->sin6_addr) != 1) return -1;
    a->sin6_family = AF_INET6;
    a->sin6_port = htons((uint16_t)port);
    t->alen = sizeof *a;
    return 0;
  }
  return -1;
}

/* A busy worker's "done", when it has said it: the worker is idle again. */
static void collect_done(struct resident *rs, struct worker *w) {
  char b;
  if (w->pid && w->busy && recv(w->ctl, &b, 1, MSG_DONTWAIT) == 1) {
    w->busy = 0;
    rs->nbusy--;
  }
}

/* Starts a worker in the empty slot i; i, or -1 when it cannot be started. */
static int start_worker(struct resident *rs, int i) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) return -1;
  pid_t pid = fork();
  if (pid == 0) worker_main(rs, sv[1]);
  close(sv[1]);
  if (pid < 0) {
    close(sv[0]);
    return -1;
  }
  int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
  rs->workers[i] = (struct worker){.pid = pid, .pidfd = pidfd < 0 ? -1 : pidfd, .ctl = sv[0]};
  rs->nworkers++;
  return i;
}

static int same_pod(const struct pod_key *a, const struct pod_key *b) {
  return a->dev == b->dev && a->ino == b->ino;
}

/* Whether `pod` holds its share of the workers already (workers that said "done" are idle). */
static int pod_at_bound(struct resident *rs, const struct pod_key *pod) {
  int held = 0;
  for (int i = 0; i < rs->opts->pool; i++) {
    struct worker *w = &rs->workers[i];
    collect_done(rs, w);
    if (w->pid && w->busy && !w->killed && same_pod(&w->pod, pod)) held++;
  }
  return held >= POOL_PER_POD(rs->opts->pool);
}

/*
 * Whether a request that finds no idle worker may wait for one: only while a worker may soon be
 * free (a slot empty, one idle behind earlier waiters, or one making a socket or reading addresses,
 * which takes microseconds). A worker busy with a connect may wait on a hung target for the probe's
 * whole timeout: when all are, nobody waits behind them, every request takes a child at once.
 */
static int worker_due_soon(const struct resident *rs) {
  for (int i = 0; i < rs->opts->pool; i++) {
    const struct worker *w = &rs->workers[i];
    if (!w->pid || !w->busy || (!w->killed && !OP_CONNECTS(w->op))) return 1;
  }
  return 0;
}

/*
 * Hands the job to an idle worker (starting one while the pool has room: a worker that died is
 * replaced by the next request that needs one); -1 when none is idle, -2 when the job's pod holds
 * its share of the workers: either way the job may take a child.
 */
static int pool_dispatch(struct resident *rs, const struct child_job *job) {
  if (pod_at_bound(rs, &job->pod)) return -2;
  int idle = -1, empty = -1;
  for (int i = 0; i < rs->opts->pool && idle < 0; i++) {
    struct worker *w = &rs->workers[i];
    if (!w->pid) {
      if (empty < 0) empty = i;
      continue;
    }
    collect_done(rs, w);
    if (!w->busy && !w->killed) idle = i;
  }
  if (idle < 0 && empty >= 0) idle = start_worker(rs, empty);
  if (idle < 0) return -1;
  struct worker *w = &rs->workers[idle];
  size_t len = offsetof(struct child_job, netns) + strlen(job->netns) + 1;
  if (send(w->ctl, job, len, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)len) {
    /* Its end is gone or jammed: it is no worker any more (reaped, and replaced, later). */
    kill_own(w->pid, w->pidfd);
    w->killed = 1;
    return -1;
  }
  w->busy = 1;
  w->id = job->id;
  w->op = job->op;
  w->pod = job->pod;
  w->started_ms = now_ms();
  w->extra_ms = OP_CONNECTS(job->op) ? job->connect_timeout_ms : 0;
  rs->nbusy++;
  return 0;
}

static void start_child(struct resident *rs, const struct child_job *job);
static int pool_enqueue(struct resident *rs, const struct child_job *job);

/* FNV-1a: a path's pod key when the request names no namespace identity (a collision only makes two pods share a bound). */
static struct pod_key pod_of(const struct request *req) {
  if (req->has_dev && req->has_ino) return (struct pod_key){.dev = req->dev, .ino = req->ino};
  uint64_t h = 14695981039346656037ULL;
  for (const unsigned char *p = (const unsigned char *)req->netns; *p; p++) h = (h ^ *p) * 1099511628211ULL;
  return (struct pod_key){.dev = UINT64_MAX, .ino = h};
}

static void spawn_child(struct resident *rs, const struct request *req, enum path_kind kind, size_t dir_index) {
  struct ns_result r = {0};
  static struct child_job job;
  memset(&job, 0, offsetof(struct child_job, netns));
  if (OP_CONNECTS(req->op)) {
    if (tcp_target(req->family, req->ip, req->port, &job.targets[0]) < 0) {
      ns_fail(&r, "request", EINVAL, "malformed request: ip is not an IPv%ld address", req->family);
      reply_error(rs, req->id, &r);
      return;
    }
    job.ntargets = 1;
    if (req->has_ip2) {
      if (tcp_target(req->family2, req->ip2, req->port, &job.targets[1]) < 0 || req->stagger_ms < 0) {
        ns_fail(&r, "request", EINVAL, "malformed request: ip2 is not an address of family2 (4 or 6), or stagger_ms is out of range");
        reply_error(rs, req->id, &r);
        return;
      }
      job.ntargets = 2;
    }
    job.connect_timeout_ms = (int)req->timeout_ms;
    job.stagger_ms = (int)req->stagger_ms;
    if (req->has_send) {
      memcpy(job.send, req->send, req->send_len);
      job.send_len = req->send_len;
    }
  }
  job.id = req->id;
  job.op = req->op;
  job.family = (int)req->family;
  job.kind = kind;
  job.dir = netns_base_dir(rs->allow, kind, dir_index);
  job.want = (struct ns_identity){.set = req->has_dev, .dev = req->dev, .ino = req->ino};
  job.pod = pod_of(req);
  job.chan = rs->chan;
  job.timeout_ms = rs->opts->child_timeout_ms;
  job.parent = rs->self;
  memcpy(job.netns, req->netns, strlen(req->netns) + 1);
  if (rs->opts->pool > 0) {
    /* Nobody overtakes a waiting request; when none waits, an idle worker serves at once. */
    int d = rs->q_count == 0 ? pool_dispatch(rs, &job) : pod_at_bound(rs, &job.pod) ? -2 : -1;
    if (d == 0) return;
    /* A pod at its share, or workers that may all be stuck: a child now rather than a wait. */
    if (d == -1 && worker_due_soon(rs) && pool_enqueue(rs, &job) == 0) return;
  }
  start_child(rs, &job);
}

/* The job in a per-request child; answered with an error when none can be started. */
static void start_child(struct resident *rs, const struct child_job *job) {
  struct ns_result r = {0};
  /* Children that answered may not be reaped yet: count only the ones still alive. */
  if (rs->nchildren >= rs->opts->max_children) reap(rs);
  if (rs->nchildren >= rs->opts->max_children) {
    ns_fail(&r, "busy", EAGAIN, "busy: %d sockets are being made", rs->nchildren);
    reply_error(rs, job->id, &r);
    return;
  }
  int block = take_block(rs);
  if (block < 0) {
    ns_fail_errno(&r, "fork", errno);
    reply_error(rs, job->id, &r);
    return;
  }
  struct child_job *cj = job_of(rs, block);
  memcpy(cj, job, offsetof(struct child_job, netns) + strlen(job->netns) + 1);
#if HELPER_SHARED_VM_CHILD
  /* The stack grows down from just below the job; 16-byte alignment is what both ABIs want. */
  char *top = (char *)((uintptr_t)cj & ~(uintptr_t)15);
  pid_t pid = clone(child_main, top, CLONE_VM | SIGCHLD, cj);
#else
  pid_t pid = fork();
  if (pid == 0) _exit(child_main(cj));
#endif
  if (pid < 0) {
    ns_fail_errno(&r, "fork", errno);
    rs->free_blocks[rs->nfree++] = block;
    reply_error(rs, job->id, &r);
    return;
  }
  int64_t extra = OP_CONNECTS(job->op) ? job->connect_timeout_ms : 0;
  rs->children[rs->nchildren++] = (struct child_slot){.pid = pid, .id = job->id, .started_ms = now_ms(), .extra_ms = extra, .block = block};
}

/* Queues a job for the next free worker; -1 when the queue is full (the job takes a child). */
static int pool_enqueue(struct resident *rs, const struct child_job *job) {
  if (rs->q_count == rs->q_cap) return -1;
  int i = (rs->q_head + rs->q_count) % rs->q_cap;
  memcpy(&rs->queue[i], job, offsetof(struct child_job, netns) + strlen(job->netns) + 1);
  rs->queued_ms[i] = now_ms();
  rs->q_count++;
  return 0;
}

/*
 * Hands waiting jobs, oldest first, to free workers, and to children those that waited
 * QUEUE_WAIT_MS; returns the poll timeout until the oldest one is due (-1: none waits).
 */
static int drain_queue(struct resident *rs) {
  while (rs->q_count > 0) {
    struct child_job *job = &rs->queue[rs->q_head];
    int64_t waited = now_ms() - rs->queued_ms[rs->q_head];
    int d = pool_dispatch(rs, job);
    if (d < 0) {
      if (d == -1 && waited < QUEUE_WAIT_MS && worker_due_soon(rs)) return (int)(QUEUE_WAIT_MS - waited);
      start_child(rs, job);
    }
    rs->q_head = (rs->q_head + 1) % rs->q_cap;
    rs->q_count--;
  }
  return -1;
}

/* --warm: the same work in this process, returning to the home netns before anything else. */
static void make_warm(struct resident *rs, const struct request *req, enum path_kind kind, size_t dir_index) {
  struct ns_result r = {0};
  int s = -1;
  struct ns_identity want = {.set = req->has_dev, .dev = req->dev, .ino = req->ino};
  int nsfd = netns_open_checked(req->netns, kind, netns_base_dir(rs->allow, kind, dir_index), &want, &r);
  if (nsfd >= 0) {
    if (setns(nsfd, CLONE_NEWNET) < 0) {
      ns_fail_errno(&r, "setns", errno);
    } else {
      s = socket(family_to_af((int)req->family), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      int e = errno;
      if (setns(rs->home_netns, CLONE_NEWNET) < 0) {
        /* Every later socket would land in the wrong netns: die, the agent restarts us. */
        fprintf(stderr, "probe-agent-netns-helper: cannot return to the home netns: %s\n", strerror(errno));
        _exit(70);
      }
      if (s < 0) ns_fail_errno(&r, "socket", e);
    }
    close(nsfd);
  }
  char line[OUT_LINE_MAX];
  size_t len = s >= 0 ? format_handle_line(line, sizeof line, req->id) : format_error_line(line, sizeof line, req->id, &r);
  reply(rs, line, len, s);
}

static void handle_line(struct resident *rs, const char *line, size_t len) {
  static struct request req;
  const char *why = NULL;
  struct ns_result r = {0};
  if (parse_request(line, len, &req, &why) < 0) {
    if (req.has_id && !req.has_cmd) {
      ns_fail(&r, "request", EINVAL, "malformed request: %s", why);
      reply_error(rs, req.id, &r);
    } else {
      fprintf(stderr, "probe-agent-netns-helper: dropping a malformed line: %s\n", why);
    }
    return;
  }
  if (req.has_cmd) {
    /* Node's ACK for a handle (the agent drops them; any other Node peer sends them); a NACK means it lost one (its request times out). */
    if (strcmp(req.cmd, "NODE_HANDLE_ACK") != 0) log_escaped("agent sent ", req.cmd);
    return;
  }
  if (!req.has_id) {
    fprintf(stderr, "probe-agent-netns-helper: dropping a request without an id\n");
    return;
  }
  if (req.has_dev != req.has_ino) {
    ns_fail(&r, "request", EINVAL, "malformed request: dev and ino go together");
    reply_error(rs, req.id, &r);
    return;
  }
  if (req.op == OP_ADDRS ? !req.has_netns : (!req.has_netns || !req.has_family || (req.family != 4 && req.family != 6))) {
    ns_fail(&r, "request", EINVAL, req.op == OP_ADDRS ? "malformed request: want netns" : "malformed request: want netns and family 4 or 6");
    reply_error(rs, req.id, &r);
    return;
  }
  if (OP_CONNECTS(req.op) && (!req.has_ip || !req.has_port || req.port < 1 || !req.has_timeout || req.timeout_ms < 1)) {
    ns_fail(&r, "request", EINVAL, "malformed request: op %s wants ip, port 1..65535 and timeout_ms 1..%d", req.op == OP_CONNECT ? "connect" : "tcp", TCP_TIMEOUT_MS_MAX);
    reply_error(rs, req.id, &r);
    return;
  }
  if (req.has_send && req.op != OP_CONNECT) {
    ns_fail(&r, "request", EINVAL, "malformed request: send is for op connect only");
    reply_error(rs, req.id, &r);
    return;
  }
  /* Pure string checks, done here: a refused path costs no child. */
  size_t dir_index = 0;
  enum path_kind kind = netns_check_path(req.netns, rs->allow, &r, &dir_index);
  if (kind == PATH_INVALID) {
    reply_error(rs, req.id, &r);
    return;
  }
  /*
   * Reading addresses is not on a probe's path: always a child, even --warm (its dump may be slow).
   * A TCP probe connects, which may wait its whole timeout: always a child too.
   */
  if (rs->opts->warm && req.op == OP_SOCKET) make_warm(rs, &req, kind, dir_index);
  else spawn_child(rs, &req, kind, dir_index);
}

/* The agent hears of every lost worker (metrics); its request, if any, is answered for. */
static int reap_worker(struct resident *rs, pid_t pid, int st) {
  for (int i = 0; i < rs->opts->pool; i++) {
    struct worker *w = &rs->workers[i];
    if (w->pid != pid) continue;
    /* It may have answered just before it died. */
    collect_done(rs, w);
    int timeout = w->killed && w->busy;
    if (w->busy) {
      struct ns_result r = {0};
      if (timeout) ns_fail(&r, "child", ETIMEDOUT, "worker killed after %lld ms", (long long)(rs->opts->child_timeout_ms + w->extra_ms));
      else if (WIFSIGNALED(st)) ns_fail(&r, "child", ECHILD, "worker killed by signal %d", WTERMSIG(st));
      else ns_fail(&r, "child", ECHILD, "worker exited with status %d without answering", WEXITSTATUS(st));
      reply_error(rs, w->id, &r);
      rs->nbusy--;
    }
    char line[128];
    int len = snprintf(line, sizeof line, "{\"event\":\"worker-lost\",\"pid\":%d,\"why\":\"%s\"}\n", (int)pid, timeout ? "timeout" : "crash");
    reply(rs, line, (size_t)len, -1);
    close(w->ctl);
    if (w->pidfd >= 0) close(w->pidfd);
    *w = (struct worker){0};
    rs->nworkers--;
    return 1;
  }
  return 0;
}

static void reap(struct resident *rs) {
  for (;;) {
    int st;
    pid_t pid = waitpid(-1, &st, WNOHANG);
    if (pid <= 0) return;
    if (reap_worker(rs, pid, st)) continue;
    for (int i = 0; i < rs->nchildren; i++) {
      struct child_slot *c = &rs->children[i];
      if (c->pid != pid) continue;
      /* Exit 0 means the child delivered its own answer; otherwise answer for it. */
      if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
        struct ns_result r = {0};
        if (c->killed) ns_fail(&r, "child", ETIMEDOUT, "child killed after %lld ms", (long long)(rs->opts->child_timeout_ms + c->extra_ms));
        else if (WIFSIGNALED(st)) ns_fail(&r, "child", ECHILD, "child killed by signal %d", WTERMSIG(st));
        else ns_fail(&r, "child", ECHILD, "child exited with status %d without answering", WEXITSTATUS(st));
        reply_error(rs, c->id, &r);
      }
      /* Dead and reaped: nothing runs on its block any more. */
      rs->free_blocks[rs->nfree++] = c->block;
      rs->children[i] = rs->children[--rs->nchildren];
      break;
    }
  }
}

/* Kills `pid` once its job is past `due`, else lowers `*next` (ms until the soonest due; -1: none). */
static void enforce_deadline(pid_t pid, int pidfd, int64_t due, int64_t now, int *killed, int64_t *next) {
  if (due <= now) {
    kill_own(pid, pidfd);
    *killed = 1;
  } else if (*next < 0 || due - now < *next) {
    *next = due - now;
  }
}

/* Kills workers and children past their lifetime; returns the poll timeout until the next one is due. */
static int enforce_deadlines(struct resident *rs) {
  int64_t now = now_ms(), next = -1;
  for (int i = 0; i < rs->opts->pool; i++) {
    struct worker *w = &rs->workers[i];
    collect_done(rs, w);
    if (!w->pid || !w->busy || w->killed) continue;
    enforce_deadline(w->pid, w->pidfd, w->started_ms + rs->opts->child_timeout_ms + w->extra_ms, now, &w->killed, &next);
  }
  for (int i = 0; i < rs->nchildren; i++) {
    struct child_slot *c = &rs->children[i];
    if (c->killed) continue;
    enforce_deadline(c->pid, -1, c->started_ms + rs->opts->child_timeout_ms + c->extra_ms, now, &c->killed, &next);
  }
  return (int)next;
}

void log_escaped(const char *what, const char *value) {
  char buf[256];
  struct text t;
  text_init(&t, buf, sizeof buf);
  text_json(&t, value);
  fprintf(stderr, "probe-agent-netns-helper: %s\"%s\"%s\n", what, buf, t.overflow ? "..." : "");
}

/*
 * A request is read only while its answer has room in the reply queue, next to one reserved for
 * each live child (answered for by the resident when it dies silent). So no answer is ever dropped
 * for a full queue: an agent that stops reading stops being read (bounded backpressure).
 */
static int can_take_request(const struct resident *rs) {
  /*
   * A worker may need two: its request's answer (counted in nbusy) and the news that it was lost.
   * The news is reserved for every slot of the pool, live or not: a request may start a worker,
   * and then needs both, where only its answer's room was checked.
   */
  return rs->out_count + (size_t)rs->nchildren + (size_t)rs->opts->pool + (size_t)rs->nbusy + (size_t)rs->q_count < rs->out_cap;
}

/* A line longer than MAX_LINE - 1 bytes: answered with an error when its first bytes name an id. */
static void answer_overlong(struct resident *rs, const char *buf, size_t len) {
  static struct request req;
  const char *why = NULL;
  /* Whether or not the cut prefix parses: it is not the whole request. */
  (void)parse_request(buf, len, &req, &why);
  if (!req.has_id || req.has_cmd) {
    fprintf(stderr, "probe-agent-netns-helper: dropping a line longer than %d bytes\n", MAX_LINE);
    return;
  }
  struct ns_result r = {0};
  ns_fail(&r, "request", EMSGSIZE, "malformed request: the line is longer than %d bytes", MAX_LINE - 1);
  reply_error(rs, req.id, &r);
}

/* Handles the complete lines in buf while the reply queue has room; keeps the rest. */
static void drain_lines(struct resident *rs, char *buf, size_t *used, int *discarding) {
  size_t start = 0;
  while (start < *used && can_take_request(rs)) {
    const char *nl = memchr(buf + start, '\n', *used - start);
    if (!nl) break;
    size_t end = (size_t)(nl - buf);
    if (!*discarding) handle_line(rs, buf + start, end - start);
    *discarding = 0;
    start = end + 1;
  }
  memmove(buf, buf + start, *used - start);
  *used -= start;
  if (*used == MAX_LINE && can_take_request(rs)) {
    if (!*discarding) answer_overlong(rs, buf, *used);
    *used = 0;
    *discarding = 1;
  }
}

/* Reads what the channel has, when there is room to answer it; returns 0 on EOF or a fatal error. */
static int read_channel(struct resident *rs, char *buf, size_t *used, int *discarding) {
  if (!can_take_request(rs) || *used == MAX_LINE) return 1;
  ssize_t n = recv(rs->chan, buf + *used, MAX_LINE - *used, MSG_DONTWAIT);
  if (n == 0) return 0;
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  *used += (size_t)n;
  drain_lines(rs, buf, used, discarding);
  return 1;
}

static int resident_init(struct resident *rs, int chan, const struct allow_dirs *a, const struct resident_opts *o) {
  *rs = (struct resident){.chan = chan, .allow = a, .opts = o, .self = getpid(), .home_netns = -1};
  rs->children = calloc((size_t)o->max_children, sizeof *rs->children);
  rs->blocks = calloc((size_t)o->max_children, sizeof *rs->blocks);
  rs->free_blocks = calloc((size_t)o->max_children, sizeof *rs->free_blocks);
  rs->page = (size_t)sysconf(_SC_PAGESIZE);
  size_t job_bytes = (sizeof(struct child_job) + rs->page - 1) / rs->page * rs->page;
  rs->block_bytes = rs->page + CHILD_STACK_BYTES + job_bytes;
  /* Room for an answer per child (a killed child's answer waits here when the agent lags) and more. */
  rs->q_cap = QUEUE_PER_WORKER * o->pool;
  rs->out_cap = (size_t)o->max_children + 16 + 2 * (size_t)o->pool + (size_t)rs->q_cap;
  rs->outq = calloc(rs->out_cap, sizeof *rs->outq);
  rs->workers = calloc((size_t)o->pool + 1, sizeof *rs->workers);
  rs->queue = calloc((size_t)rs->q_cap + 1, sizeof *rs->queue);
  rs->queued_ms = calloc((size_t)rs->q_cap + 1, sizeof *rs->queued_ms);
  if (!rs->children || !rs->blocks || !rs->free_blocks || !rs->outq || !rs->workers || !rs->queue || !rs->queued_ms) {
    fprintf(stderr, "probe-agent-netns-helper: out of memory\n");
    return -1;
  }
  if (o->warm && (rs->home_netns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC)) < 0) {
    fprintf(stderr, "probe-agent-netns-helper: cannot open the home netns: %s\n", strerror(errno));
    return -1;
  }
  return 0;
}

static void drop_outq(struct resident *rs) {
  for (; rs->out_count > 0; rs->out_count--, rs->out_head = (rs->out_head + 1) % rs->out_cap) {
    if (rs->outq[rs->out_head].fd >= 0) close(rs->outq[rs->out_head].fd);
  }
  rs->out_head = 0;
}

/* The agent is gone: nobody can use what is still being made. */
static void kill_children(struct resident *rs) {
  for (int i = 0; i < rs->nchildren; i++) kill_own(rs->children[i].pid, -1);
  for (int i = 0; i < rs->opts->pool; i++) {
    struct worker *w = &rs->workers[i];
    if (!w->pid) continue;
    kill_own(w->pid, w->pidfd);
    waitpid(w->pid, NULL, 0);
    close(w->ctl);
    if (w->pidfd >= 0) close(w->pidfd);
    *w = (struct worker){0};
  }
  rs->nworkers = rs->nbusy = 0;
  rs->q_count = 0;
  while (rs->nchildren > 0) {
    pid_t pid = waitpid(-1, NULL, 0);
    if (pid < 0) break;
    for (int i = 0; i < rs->nchildren; i++) {
      if (rs->children[i].pid == pid) {
        rs->free_blocks[rs->nfree++] = rs->children[i].block;
        rs->children[i] = rs->children[--rs->nchildren];
      }
    }
  }
}

int run_resident(int chan, const struct allow_dirs *a, const struct resident_opts *o) {
  static char inbuf[MAX_LINE];
  struct resident rs;
  if (resident_init(&rs, chan, a, o) < 0) return 1;
  struct pollfd *pfds = calloc((size_t)o->pool + 1, sizeof *pfds);
  if (!pfds) return 1;
  signal(SIGPIPE, SIG_IGN);
  /*
   * Children are reaped on every wake-up rather than on SIGCHLD (left at its default: no wake-up):
   * waking once more for each exit cost about 20 us per socket. (The agent no longer sends Node's
   * ACK for each handle, agent/netns/ipc-channel.ts, so a child is mostly reaped at the next
   * request.) While children live, poll at least every REAP_INTERVAL_MS, so one that died without
   * answering is still answered for within that.
   */
  size_t used = 0;
  int discarding = 0;
  for (;;) {
    reap(&rs);
    /* Lines read while the reply queue was full, now that it may have room. */
    drain_lines(&rs, inbuf, &used, &discarding);
    int timeout = enforce_deadlines(&rs);
    int queue_due = drain_queue(&rs);
    if (queue_due >= 0 && (timeout < 0 || queue_due < timeout)) timeout = queue_due;
    if (rs.nchildren > 0 && (timeout < 0 || timeout > REAP_INTERVAL_MS)) timeout = REAP_INTERVAL_MS;
    short in = can_take_request(&rs) && used < MAX_LINE ? POLLIN : 0;
    struct pollfd *p = pfds;
    p[0] = (struct pollfd){.fd = chan, .events = (short)(in | (rs.out_count ? POLLOUT : 0))};
    /*
     * A busy worker's control socket: its hang-up (a worker that dies is answered for at once) and,
     * while jobs wait for a worker, its "done".
     */
    nfds_t n = 1;
    short done = rs.q_count > 0 ? POLLIN : 0;
    for (int i = 0; i < o->pool; i++) {
      if (rs.workers[i].pid && rs.workers[i].busy) p[n++] = (struct pollfd){.fd = rs.workers[i].ctl, .events = done};
    }
    if (poll(p, n, timeout) < 0) {
      if (errno == EINTR) continue;
      fprintf(stderr, "probe-agent-netns-helper: poll: %s\n", strerror(errno));
      break;
    }
    if (p[0].revents & (POLLOUT | POLLHUP | POLLERR)) flush_outq(&rs);
    if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) && !read_channel(&rs, inbuf, &used, &discarding)) break;
  }
  kill_children(&rs);
  return 0;
}

/* One turn of the resident's loop for the fuzzer, with `drain` reading the agent's end. */
static void fuzz_round(struct resident *rs, void (*drain)(void)) {
  reap(rs);
  enforce_deadlines(rs);
  drain_queue(rs);
  flush_outq(rs);
  drain();
  poll(NULL, 0, 1);
}

/* A worker between jobs holds stdio, the channel, its control socket and its home netns: 6. */
static void fuzz_check_idle_workers(const struct resident *rs) {
  for (int i = 0; i < rs->opts->pool; i++) {
    const struct worker *w = &rs->workers[i];
    if (!w->pid || w->busy || w->killed) continue;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)w->pid);
    int n = 0;
    DIR *d = opendir(path);
    if (!d) continue; /* died meanwhile: reaped next round */
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    if (n != 6) {
      fprintf(stderr, "fuzz-dispatch: idle worker %d holds %d descriptors, not 6\n", (int)w->pid, n);
      abort();
    }
  }
}

/*
 * The dispatch fuzzer's entry: one input is a run of request lines, fed as the channel would bring
 * them, then the loop turns (as run_resident's, with `drain` reading the agent's end) until every
 * request is settled: no child, no busy worker, nothing queued or unsent. Idle workers are checked
 * to hold nothing of a pod, then stopped, so the caller can count its own descriptors. Returns 0
 * when settled within `budget_ms`, else -1 (everything killed: the caller cannot check answers).
 */
int resident_feed_for_fuzzing(int chan, const struct allow_dirs *a, const struct resident_opts *o, const char *data, size_t len,
                              void (*drain)(void), int budget_ms) {
  static struct resident rs;
  static int ready;
  static char inbuf[MAX_LINE];
  if (!ready) {
    if (resident_init(&rs, chan, a, o) < 0) abort();
    ready = 1;
  }
  int64_t end = now_ms() + budget_ms;
  size_t used = 0;
  int discarding = 0, settled = 1;
  while (len > 0 || (used > 0 && memchr(inbuf, '\n', used))) {
    size_t n = len < MAX_LINE - used ? len : MAX_LINE - used;
    memcpy(inbuf + used, data, n);
    used += n;
    data += n;
    len -= n;
    size_t before = used + len;
    drain_lines(&rs, inbuf, &used, &discarding);
    if (used + len == before) fuzz_round(&rs, drain);
    if (now_ms() > end) {
      settled = 0;
      break;
    }
  }
  while (settled && (rs.nchildren > 0 || rs.nbusy > 0 || rs.q_count > 0 || rs.out_count > 0)) {
    fuzz_round(&rs, drain);
    if (now_ms() > end) settled = 0;
  }
  if (settled) fuzz_check_idle_workers(&rs);
  kill_children(&rs);
  flush_outq(&rs);
  drop_outq(&rs);
  drain();
  return settled ? 0 : -1;
}
