/*
 * Bounded text building without stdio, locale, errno or allocation: the shared-VM child
 * (resident.c) formats its answer with these, since it may touch nothing but its own stack.
 */
#include "helper.h"

#include <string.h>

void text_init(struct text *t, char *buf, size_t cap) {
  t->buf = buf;
  t->cap = cap;
  t->len = 0;
  t->overflow = cap == 0;
  if (cap) buf[0] = '\0';
}

static void text_putc(struct text *t, char c) {
  if (t->len + 1 >= t->cap) {
    t->overflow = 1;
    return;
  }
  t->buf[t->len++] = c;
  t->buf[t->len] = '\0';
}

void text_str(struct text *t, const char *s) {
  size_t n = strlen(s);
  if (t->overflow || t->len + n >= t->cap) {
    /* Keep what fits: messages are cut, lines are refused by the caller through overflow. */
    for (; *s && !t->overflow; s++) text_putc(t, *s);
    t->overflow = 1;
    return;
  }
  memcpy(t->buf + t->len, s, n + 1);
  t->len += n;
}

void text_u64(struct text *t, uint64_t v) {
  char digits[24];
  size_t i = sizeof digits;
  digits[--i] = '\0';
  do {
    digits[--i] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  text_str(t, digits + i);
}

void text_i64(struct text *t, int64_t v) {
  if (v < 0) {
    text_putc(t, '-');
    text_u64(t, (uint64_t)0 - (uint64_t)v);
  } else {
    text_u64(t, (uint64_t)v);
  }
}

void text_json(struct text *t, const char *s) {
  static const char hex[] = "0123456789abcdef";
  for (const unsigned char *c = (const unsigned char *)s; *c && !t->overflow; c++) {
    if (*c == '"' || *c == '\\') {
      text_putc(t, '\\');
      text_putc(t, (char)*c);
    } else if (*c < 0x20 || *c == 0x7f) {
      char esc[7] = {'\\', 'u', '0', '0', hex[*c >> 4], hex[*c & 15], '\0'};
      text_str(t, esc);
    } else {
      text_putc(t, (char)*c);
    }
  }
}

void text_base64(struct text *t, const unsigned char *data, size_t len) {
  static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  if (t->overflow || t->len + (len + 2) / 3 * 4 >= t->cap) {
    t->overflow = 1;
    return;
  }
  char *o = t->buf + t->len;
  size_t i = 0;
  for (; i + 2 < len; i += 3) {
    unsigned v = (unsigned)data[i] << 16 | (unsigned)data[i + 1] << 8 | data[i + 2];
    *o++ = abc[v >> 18];
    *o++ = abc[(v >> 12) & 63];
    *o++ = abc[(v >> 6) & 63];
    *o++ = abc[v & 63];
  }
  if (i < len) {
    unsigned v = (unsigned)data[i] << 16 | (i + 1 < len ? (unsigned)data[i + 1] << 8 : 0);
    *o++ = abc[v >> 18];
    *o++ = abc[(v >> 12) & 63];
    *o++ = i + 1 < len ? abc[(v >> 6) & 63] : '=';
    *o++ = '=';
  }
  *o = '\0';
  t->len = (size_t)(o - t->buf);
}
