/**
 * agent/http2/informational.ts: which statuses and header blocks are 1xx heads, the one rule the
 * HTTP/1 client, the HTTP/2 unary client, the connection's frame budget and the gRPC prober share.
 */
import { describe, expect, it } from 'vitest';
import { MAX_1XX_RESPONSES, isInformational, isInformationalBlock } from '../../agent/http2/informational.ts';

describe('informational heads', () => {
  it('takes 100-199 and nothing else', () => {
    expect([100, 101, 103, 150, 199].map(isInformational)).toEqual([true, true, true, true, true]);
    expect([0, 99, 200, 204, 300, 500, Number.NaN].map(isInformational)).toEqual([false, false, false, false, false, false, false]);
  });

  it("reads a block's :status among the pseudo-headers only", () => {
    expect(isInformationalBlock([{ name: ':status', value: '103' }, { name: 'link', value: '</a>' }])).toBe(true);
    expect(isInformationalBlock([{ name: ':status', value: '200' }])).toBe(false);
    // A malformed status is not a 1xx head: the caller's own rule reports it.
    expect(isInformationalBlock([{ name: ':status', value: '1xx' }])).toBe(false);
    expect(isInformationalBlock([{ name: ':status', value: '1000' }])).toBe(false);
    // A :status after a regular field is no pseudo-header: not a head.
    expect(isInformationalBlock([{ name: 'x', value: 'y' }, { name: ':status', value: '100' }])).toBe(false);
    expect(isInformationalBlock([])).toBe(false);
  });

  it("keeps Go's limit of five", () => {
    expect(MAX_1XX_RESPONSES).toBe(5);
  });
});
