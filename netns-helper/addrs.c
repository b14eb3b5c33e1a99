/*
 * A netns's own addresses, read with one netlink RTM_GETADDR dump from inside it: what the address
 * resolver and `probe-agent probe` need, without running `ip`/`nsenter` per netns. Runs in the
 * resident's shared-VM child (it enters the netns for good and exits right after), so it is
 * child-safe: raw system calls (sys.h), text.c, and nothing but its own stack.
 */
#define _GNU_SOURCE
#include "helper.h"
#include "sys.h"

#include <errno.h>
#include <linux/if_addr.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sched.h>
#include <string.h>
#include <sys/socket.h>

/* Enough for the dump of a pod's handful of interfaces in one or a few reads. */
#define NL_BUF 8192
/* Reads of one dump before we give up: a netns with this many addresses is not a pod's. */
#define NL_MAX_READS 64

static void text_ipv4(struct text *t, const unsigned char *a) {
  for (int i = 0; i < 4; i++) {
    if (i) text_str(t, ".");
    text_u64(t, a[i]);
  }
}

/* Eight uncompressed hex groups; the agent canonicalises (it compares canonical spellings). */
static void text_ipv6(struct text *t, const unsigned char *a) {
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 8; i++) {
    unsigned g = (unsigned)a[2 * i] << 8 | a[2 * i + 1];
    char buf[6];
    size_t n = 0;
    int started = 0;
    for (int shift = 12; shift >= 0; shift -= 4) {
      unsigned d = (g >> shift) & 15;
      if (d || started || shift == 0) {
        buf[n++] = hex[d];
        started = 1;
      }
    }
    buf[n] = '\0';
    if (i) text_str(t, ":");
    text_str(t, buf);
  }
}

/*
 * Appends the netns's global and site-scope addresses to `t` as JSON strings separated by commas
 * (loopback and link-local are the same in every netns: never evidence of which pod it is).
 * Returns the number of addresses, or -1 with `r` set. `t->overflow` means more than fit.
 */
static int dump_addresses(struct text *t, struct ns_result *r) {
  int s = sys_socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (s < 0) {
    ns_fail_errno(r, "netlink", -s);
    return -1;
  }
  struct {
    struct nlmsghdr nh;
    struct ifaddrmsg ifa;
  } req;
  memset(&req, 0, sizeof req);
  req.nh.nlmsg_len = sizeof req;
  req.nh.nlmsg_type = RTM_GETADDR;
  req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  req.nh.nlmsg_seq = 1;
  req.ifa.ifa_family = AF_UNSPEC;
  struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
  struct iovec iov = {.iov_base = &req, .iov_len = sizeof req};
  struct msghdr mh = {.msg_name = &kernel, .msg_namelen = sizeof kernel, .msg_iov = &iov, .msg_iovlen = 1};
  long n = sys_sendmsg(s, &mh, 0);
  if (n < 0) {
    ns_fail_errno(r, "netlink", (int)-n);
    sys_close(s);
    return -1;
  }
  /* Aligned for nlmsghdr; on the child's own stack. */
  _Static_assert(NL_BUF % sizeof(unsigned long) == 0, "aligned buffer");
  unsigned long buf[NL_BUF / sizeof(unsigned long)];
  int count = 0;
  for (int reads = 0; reads < NL_MAX_READS; reads++) {
    struct iovec riov = {.iov_base = buf, .iov_len = sizeof buf};
    struct msghdr rmh = {.msg_name = &kernel, .msg_namelen = sizeof kernel, .msg_iov = &riov, .msg_iovlen = 1};
    do {
      n = sys_recvmsg(s, &rmh, 0);
    } while (n == -EINTR);
    if (n < 0) {
      ns_fail_errno(r, "netlink", (int)-n);
      break;
    }
    if (rmh.msg_flags & MSG_TRUNC) {
      ns_fail_text(r, "netlink", EMSGSIZE, "netlink message truncated", NULL, NULL);
      break;
    }
    int len = (int)n;
    for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (unsigned)len); h = NLMSG_NEXT(h, len)) {
      if (h->nlmsg_type == NLMSG_DONE) {
        sys_close(s);
        return count;
      }
      if (h->nlmsg_type == NLMSG_ERROR) {
        const struct nlmsgerr *e = NLMSG_DATA(h);
        ns_fail_errno(r, "netlink", e->error < 0 ? -e->error : EPROTO);
        sys_close(s);
        return -1;
      }
      if (h->nlmsg_type != RTM_NEWADDR || h->nlmsg_len < NLMSG_LENGTH(sizeof(struct ifaddrmsg))) continue;
      const struct ifaddrmsg *ifa = NLMSG_DATA(h);
      if (ifa->ifa_scope == RT_SCOPE_HOST || ifa->ifa_scope == RT_SCOPE_LINK || ifa->ifa_scope == RT_SCOPE_NOWHERE) continue;
      if (ifa->ifa_family != AF_INET && ifa->ifa_family != AF_INET6) continue;
      size_t want = ifa->ifa_family == AF_INET ? 4 : 16;
      const unsigned char *local = NULL, *address = NULL;
      int alen = (int)IFA_PAYLOAD(h);
      for (struct rtattr *a = IFA_RTA(ifa); RTA_OK(a, alen); a = RTA_NEXT(a, alen)) {
        if (RTA_PAYLOAD(a) != want) continue;
        if (a->rta_type == IFA_LOCAL) local = RTA_DATA(a);
        else if (a->rta_type == IFA_ADDRESS) address = RTA_DATA(a);
      }
      /* As iproute2: IFA_LOCAL is the interface's own address (IFA_ADDRESS is the peer on point-to-point links). */
      const unsigned char *own = local ? local : address;
      if (!own) continue;
      if (count) text_str(t, ",");
      text_str(t, "\"");
      if (ifa->ifa_family == AF_INET) text_ipv4(t, own);
      else text_ipv6(t, own);
      text_str(t, "\"");
      count++;
    }
  }
  if (!r->stage) ns_fail_text(r, "netlink", E2BIG, "netlink dump did not end", NULL, NULL);
  sys_close(s);
  return -1;
}

size_t netns_addresses_line(char *buf, size_t cap, uint64_t id, const char *path, enum path_kind kind, const char *dir,
                            const struct ns_identity *want, struct ns_result *r) {
  int nsfd = netns_open_checked(path, kind, dir, want, r);
  if (nsfd < 0) return 0;
  int e = sys_setns(nsfd, CLONE_NEWNET);
  sys_close(nsfd);
  if (e < 0) {
    ns_fail_errno(r, "setns", -e);
    return 0;
  }
  struct text t;
  text_init(&t, buf, cap);
  text_str(&t, "{\"id\":");
  text_u64(&t, id);
  text_str(&t, ",\"ok\":true,\"addrs\":[");
  if (dump_addresses(&t, r) < 0) return 0;
  text_str(&t, "]}\n");
  if (t.overflow) {
    ns_fail_text(r, "netlink", E2BIG, "the netns has more addresses than one answer holds", NULL, NULL);
    return 0;
  }
  return t.len;
}
