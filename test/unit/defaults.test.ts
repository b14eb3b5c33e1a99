/** The webhook's defaults against each other and the bounds they promise (agent/webhook/defaults.ts). */
import { describe, expect, it } from 'vitest';
import * as d from '../../agent/webhook/defaults.ts';

describe('webhook defaults', () => {
  it('one largest review fits the request cap and the in-flight budget', () => {
    expect(d.DEFAULT_MAX_REQUEST_BYTES).toBe(3 * 1024 * 1024);
    expect(d.DEFAULT_MAX_INFLIGHT_BYTES).toBeGreaterThanOrEqual(d.DEFAULT_MAX_REQUEST_BYTES);
  });

  it('at least four reading requests per review slot', () => {
    expect(d.DEFAULT_MAX_READING_REQUESTS).toBeGreaterThanOrEqual(4 * d.DEFAULT_MAX_CONCURRENT_REQUESTS);
  });

  it('the headers and body timeouts leave the API server part of its 3 s webhook timeout', () => {
    expect(d.DEFAULT_HEADERS_TIMEOUT_MS).toBeLessThan(3000);
    expect(d.DEFAULT_BODY_TIMEOUT_MS).toBeLessThan(3000);
    expect(d.DEFAULT_READING_GRACE_MS).toBeLessThan(d.DEFAULT_BODY_TIMEOUT_MS);
  });

  it('connection bounds are positive integers, unverified callers fewer than verified ones', () => {
    for (const v of [d.DEFAULT_MAX_HANDSHAKES, d.DEFAULT_MAX_CONNECTIONS, d.DEFAULT_MAX_UNVERIFIED_CONNECTIONS, d.DEFAULT_MAX_CONCURRENT_REQUESTS, d.SHED_RETRY_AFTER_SECONDS, d.DEFAULT_TLS_RELOAD_INTERVAL_MS]) {
      expect(Number.isInteger(v) && v > 0).toBe(true);
    }
    expect(d.DEFAULT_MAX_UNVERIFIED_CONNECTIONS).toBeLessThan(d.DEFAULT_MAX_CONNECTIONS);
  });

  it('loads without the webhook server (the CLI shows them from this module alone)', async () => {
    const text = (await import('node:fs')).readFileSync(new URL('../../agent/webhook/defaults.ts', import.meta.url), 'utf8');
    expect(text).not.toMatch(/^import /m);
  });
});
