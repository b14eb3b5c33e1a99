import { describe, expect, it } from 'vitest';
import { canonicalIp } from '../../agent/netns/ip.ts';

describe('canonicalIp: one spelling per address', () => {
  it.each([
    ['10.0.0.1', '10.0.0.1'],
    ['FD00:0:0:0:0:0:0:1', 'fd00::1'],
    ['fd00::0001', 'fd00::1'],
    ['::ffff:10.0.0.1', '::ffff:a00:1'],
    ['2001:DB8::A', '2001:db8::a'],
    ['::', '::'],
  ])('%s -> %s', (input, want) => {
    expect(canonicalIp(input)).toBe(want);
  });

  it('the same address from kubelet and from netlink compares equal', () => {
    expect(canonicalIp('fd00:0::1')).toBe(canonicalIp('FD00::0:1'));
  });

  it.each(['', 'pod.example', '10.0.0', '10.0.0.256', '1.2.3.4/24', '[fd00::1]', 'fe80::1%eth0x'.repeat(6), ' 10.0.0.1', '::1::2'])('not an IP: %j', (input) => {
    expect(canonicalIp(input)).toBeUndefined();
  });

  it('refuses a non-string and anything longer than an address can be, without parsing it', () => {
    expect(canonicalIp(7 as unknown as string)).toBeUndefined();
    expect(canonicalIp('1'.repeat(65))).toBeUndefined();
    expect(canonicalIp(`${'0:'.repeat(32)}1`)).toBeUndefined();
  });
});
