/*
 * libFuzzer target: the request parser (jsonreq.c) on any bytes, then what the resident does with
 * a parsed request before any child: the path rules and the error line. Checks its invariants
 * (strings terminated inside their buffers, bounded numbers, a reason for every refusal).
 */
#include "../helper.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void bounded(const char *s, size_t cap) {
  if (!memchr(s, '\0', cap)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static struct request req;
  static struct allow_dirs allow;
  static int ready;
  if (!ready) {
    if (allow_dirs_init(&allow) < 0) abort();
    ready = 1;
  }
  const char *why = NULL;
  /* The resident hands the parser lines of at most MAX_LINE bytes. */
  if (size > MAX_LINE) size = MAX_LINE;
  if (parse_request((const char *)data, size, &req, &why) < 0) {
    if (!why) abort();
    return 0;
  }
  bounded(req.netns, sizeof req.netns);
  bounded(req.cmd, sizeof req.cmd);
  bounded(req.ip, sizeof req.ip);
  bounded(req.ip2, sizeof req.ip2);
  if (req.has_id && req.id > MAX_REQUEST_ID) abort();
  if (req.has_port && req.port > 65535) abort();
  if (req.has_timeout && req.timeout_ms > TCP_TIMEOUT_MS_MAX) abort();
  if (req.has_netns) {
    struct ns_result r = {0};
    size_t dir_index = 0;
    enum path_kind k = netns_check_path(req.netns, &allow, &r, &dir_index);
    if (k == PATH_INVALID) {
      char line[1024];
      if (!r.stage || format_error_line(line, sizeof line, req.id, &r) == 0) abort();
    } else if (k == PATH_DIR && dir_index >= allow.n) {
      abort();
    }
  }
  return 0;
}
