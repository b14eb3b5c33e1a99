/*
 * A strict little JSON reader for the shapes the agent sends, {"id":N,"netns":"...",
 * "family":4|6}, {"id":N,"op":"addrs","netns":"..."} and {"id":N,"op":"tcp","netns":"...",
 * "family":4|6,"ip":"...","port":P,"timeout_ms":T[,"ip2":"...","family2":4|6,"stagger_ms":S]}, op "connect"
 * the same with an optional "send":"<base64>", each
 * optionally with "dev":D,"ino":I (the namespace the agent checked), and for Node's own
 * {"cmd":"NODE_..."} lines. Unknown keys are skipped.
 */
#include "helper.h"

#include <string.h>

struct cursor {
  const char *p;
  const char *end;
  const char *why;
};

static void skip_ws(struct cursor *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static int fail(struct cursor *c, const char *why) {
  if (!c->why) c->why = why;
  return -1;
}

static int hex4(struct cursor *c, unsigned *out) {
  if (c->end - c->p < 4) return fail(c, "truncated \\u escape");
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char h = *c->p++;
    v <<= 4;
    if (h >= '0' && h <= '9') v |= (unsigned)(h - '0');
    else if (h >= 'a' && h <= 'f') v |= (unsigned)(h - 'a' + 10);
    else if (h >= 'A' && h <= 'F') v |= (unsigned)(h - 'A' + 10);
    else return fail(c, "bad \\u escape");
  }
  *out = v;
  return 0;
}

static int put(char *out, size_t cap, size_t *o, unsigned ch) {
  if (*o + 1 >= cap) return -1;
  out[(*o)++] = (char)ch;
  return 0;
}

/* Appends code point `cp` as UTF-8; NUL is refused because it cannot be part of a path. */
static int put_utf8(struct cursor *c, char *out, size_t cap, size_t *o, unsigned cp) {
  if (cp == 0) return fail(c, "NUL in string");
  int r = 0;
  if (cp < 0x80) {
    r |= put(out, cap, o, cp);
  } else if (cp < 0x800) {
    r |= put(out, cap, o, 0xc0 | (cp >> 6));
    r |= put(out, cap, o, 0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    r |= put(out, cap, o, 0xe0 | (cp >> 12));
    r |= put(out, cap, o, 0x80 | ((cp >> 6) & 0x3f));
    r |= put(out, cap, o, 0x80 | (cp & 0x3f));
  } else {
    r |= put(out, cap, o, 0xf0 | (cp >> 18));
    r |= put(out, cap, o, 0x80 | ((cp >> 12) & 0x3f));
    r |= put(out, cap, o, 0x80 | ((cp >> 6) & 0x3f));
    r |= put(out, cap, o, 0x80 | (cp & 0x3f));
  }
  return r ? fail(c, "string too long") : 0;
}

/* Reads a JSON string into out (NULL: skip it); too long is an error, never a truncation. */
static int read_string(struct cursor *c, char *out, size_t cap) {
  char scratch[8];
  size_t o = 0;
  if (!out) {
    out = scratch;
    cap = sizeof scratch;
  }
  if (c->p >= c->end || *c->p != '"') return fail(c, "expected a string");
  c->p++;
  while (c->p < c->end) {
    unsigned char ch = (unsigned char)*c->p++;
    if (ch == '"') {
      out[out == scratch ? 0 : o] = '\0';
      return 0;
    }
    if (ch < 0x20) return fail(c, "control character in string");
    if (ch != '\\') {
      if (out != scratch && put(out, cap, &o, ch) < 0) return fail(c, "string too long");
      continue;
    }
    if (c->p >= c->end) break;
    char e = *c->p++;
    unsigned cp;
    switch (e) {
      case '"': case '\\': case '/': cp = (unsigned)e; break;
      case 'b': cp = '\b'; break;
      case 'f': cp = '\f'; break;
      case 'n': cp = '\n'; break;
      case 'r': cp = '\r'; break;
      case 't': cp = '\t'; break;
      case 'u': {
        if (hex4(c, &cp) < 0) return -1;
        if (cp >= 0xd800 && cp <= 0xdbff) {
          unsigned lo;
          if (c->end - c->p < 6 || c->p[0] != '\\' || c->p[1] != 'u') return fail(c, "lone surrogate");
          c->p += 2;
          if (hex4(c, &lo) < 0) return -1;
          if (lo < 0xdc00 || lo > 0xdfff) return fail(c, "lone surrogate");
          cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        } else if (cp >= 0xdc00 && cp <= 0xdfff) {
          return fail(c, "lone surrogate");
        }
        break;
      }
      default: return fail(c, "bad escape");
    }
    if (out != scratch && put_utf8(c, out, cap, &o, cp) < 0) return -1;
  }
  return fail(c, "unterminated string");
}

/* A non-negative integer without sign, fraction or exponent, at most MAX_REQUEST_ID. */
static int read_uint(struct cursor *c, uint64_t *out) {
  uint64_t v = 0;
  const char *start = c->p;
  while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
    v = v * 10 + (uint64_t)(*c->p++ - '0');
    if (v > MAX_REQUEST_ID) return fail(c, "number too large");
  }
  if (c->p == start) return fail(c, "expected a non-negative integer");
  if (c->p - start > 1 && *start == '0') return fail(c, "leading zero");
  if (c->p < c->end && (*c->p == '.' || *c->p == 'e' || *c->p == 'E')) return fail(c, "expected an integer");
  *out = v;
  return 0;
}

static int b64_value(unsigned char ch) {
  if (ch >= 'A' && ch <= 'Z') return ch - 'A';
  if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
  if (ch >= '0' && ch <= '9') return ch - '0' + 52;
  if (ch == '+') return 62;
  if (ch == '/') return 63;
  return -1;
}

/* Reads a JSON string of standard base64 (padded, no escapes) and decodes it into out; too long is an error. */
static int read_base64(struct cursor *c, unsigned char *out, size_t cap, size_t *len) {
  if (c->p >= c->end || *c->p != '"') return fail(c, "expected a string");
  c->p++;
  size_t o = 0;
  unsigned acc = 0;
  int bits = 0, pad = 0, n = 0;
  while (c->p < c->end && *c->p != '"') {
    unsigned char ch = (unsigned char)*c->p++;
    n++;
    if (ch == '=') {
      pad++;
      continue;
    }
    int v = b64_value(ch);
    if (v < 0 || pad) return fail(c, "bad base64");
    acc = (acc << 6) | (unsigned)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      if (o >= cap) return fail(c, "send too long");
      out[o++] = (unsigned char)(acc >> bits);
      acc &= (1u << bits) - 1;
    }
  }
  if (c->p >= c->end) return fail(c, "unterminated string");
  c->p++;
  if (n % 4 != 0 || pad > 2) return fail(c, "bad base64");
  *len = o;
  return 0;
}

/* Skips any JSON value, nesting bounded. */
static int skip_value(struct cursor *c, int depth) {
  if (depth > 16) return fail(c, "nesting too deep");
  skip_ws(c);
  if (c->p >= c->end) return fail(c, "expected a value");
  char ch = *c->p;
  if (ch == '"') return read_string(c, NULL, 0);
  if (ch == '{' || ch == '[') {
    char close = ch == '{' ? '}' : ']';
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == close) {
      c->p++;
      return 0;
    }
    for (;;) {
      if (ch == '{') {
        skip_ws(c);
        if (read_string(c, NULL, 0) < 0) return -1;
        skip_ws(c);
        if (c->p >= c->end || *c->p++ != ':') return fail(c, "expected ':'");
      }
      if (skip_value(c, depth + 1) < 0) return -1;
      skip_ws(c);
      if (c->p >= c->end) return fail(c, "unterminated container");
      if (*c->p == ',') { c->p++; continue; }
      if (*c->p == close) { c->p++; return 0; }
      return fail(c, "expected ',' or a closing bracket");
    }
  }
  /* Numbers and literals: take the run of characters that can belong to one. */
  const char *start = c->p;
  while (c->p < c->end && strchr("0123456789+-.eEtruefalsn", *c->p)) c->p++;
  return c->p == start ? fail(c, "unexpected character") : 0;
}

int parse_request(const char *line, size_t len, struct request *req, const char **why) {
  struct cursor c = {.p = line, .end = line + len, .why = NULL};
  memset(req, 0, sizeof *req);
  skip_ws(&c);
  if (c.p >= c.end || *c.p++ != '{') {
    *why = "not a JSON object";
    return -1;
  }
  skip_ws(&c);
  if (c.p < c.end && *c.p == '}') c.p++;
  else for (;;) {
    char key[256];
    skip_ws(&c);
    if (read_string(&c, key, sizeof key) < 0) break;
    skip_ws(&c);
    if (c.p >= c.end || *c.p++ != ':') { fail(&c, "expected ':'"); break; }
    skip_ws(&c);
    int r;
    if (strcmp(key, "id") == 0) {
      r = read_uint(&c, &req->id);
      /* Followed by something: the digits of a line cut short may not be the whole id. */
      req->has_id = r == 0 && c.p < c.end;
    } else if (strcmp(key, "netns") == 0) {
      r = read_string(&c, req->netns, sizeof req->netns);
      req->has_netns = r == 0;
    } else if (strcmp(key, "cmd") == 0) {
      r = read_string(&c, req->cmd, sizeof req->cmd);
      req->has_cmd = r == 0;
    } else if (strcmp(key, "op") == 0) {
      char op[16];
      r = read_string(&c, op, sizeof op);
      if (r == 0 && strcmp(op, "socket") == 0) req->op = OP_SOCKET;
      else if (r == 0 && strcmp(op, "addrs") == 0) req->op = OP_ADDRS;
      else if (r == 0 && strcmp(op, "tcp") == 0) req->op = OP_TCP;
      else if (r == 0 && strcmp(op, "connect") == 0) req->op = OP_CONNECT;
      else r = fail(&c, "unknown op");
      req->has_op = r == 0;
    } else if (strcmp(key, "ip") == 0) {
      r = read_string(&c, req->ip, sizeof req->ip);
      req->has_ip = r == 0;
    } else if (strcmp(key, "ip2") == 0) {
      r = read_string(&c, req->ip2, sizeof req->ip2);
      req->has_ip2 = r == 0;
    } else if (strcmp(key, "family2") == 0) {
      uint64_t v;
      r = read_uint(&c, &v);
      req->family2 = r == 0 && v < 100 ? (long)v : -1;
    } else if (strcmp(key, "stagger_ms") == 0) {
      uint64_t v;
      r = read_uint(&c, &v);
      req->stagger_ms = r == 0 && v <= TCP_TIMEOUT_MS_MAX ? (long)v : -1;
    } else if (strcmp(key, "port") == 0) {
      uint64_t v;
      r = read_uint(&c, &v);
      req->port = r == 0 && v <= 65535 ? (long)v : -1;
      req->has_port = r == 0;
    } else if (strcmp(key, "timeout_ms") == 0) {
      uint64_t v;
      r = read_uint(&c, &v);
      req->timeout_ms = r == 0 && v <= TCP_TIMEOUT_MS_MAX ? (long)v : -1;
      req->has_timeout = r == 0;
    } else if (strcmp(key, "send") == 0) {
      r = read_base64(&c, req->send, sizeof req->send, &req->send_len);
      req->has_send = r == 0;
    } else if (strcmp(key, "dev") == 0) {
      r = read_uint(&c, &req->dev);
      req->has_dev = r == 0;
    } else if (strcmp(key, "ino") == 0) {
      r = read_uint(&c, &req->ino);
      req->has_ino = r == 0;
    } else if (strcmp(key, "family") == 0) {
      uint64_t f;
      r = read_uint(&c, &f);
      req->family = r == 0 && f < 100 ? (long)f : -1;
      req->has_family = r == 0;
    } else {
      r = skip_value(&c, 1);
    }
    if (r < 0) break;
    skip_ws(&c);
    if (c.p < c.end && *c.p == ',') { c.p++; continue; }
    if (c.p < c.end && *c.p == '}') { c.p++; break; }
    fail(&c, "expected ',' or '}'");
    break;
  }
  if (!c.why) {
    skip_ws(&c);
    if (c.p != c.end) fail(&c, "trailing data after the object");
  }
  if (c.why) {
    *why = c.why;
    return -1;
  }
  return 0;
}
