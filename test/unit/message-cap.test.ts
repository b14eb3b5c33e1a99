/** One message cap, in UTF-8 bytes, wherever a result message is kept or sent. */
import { describe, expect, it } from 'vitest';
import { outcomeToWire, statusToWire } from '../../agent/api/convert.ts';
import { boundMessage, MAX_MESSAGE_BYTES } from '../../agent/probe/message.ts';
import type { ProbeStatus } from '../../agent/scheduler/types.ts';

// 700 characters, 1400 bytes: within a cap counted in characters, over one counted in bytes.
const wide = 'é'.repeat(700);

const status = (lastMessage: string): ProbeStatus => ({
  key: { podUID: 'u', containerName: 'app', probeType: 'Readiness' }, namespace: 'ns', podName: 'p', containerID: 'c',
  result: 'success', consecutive: 1, lastProbeTime: 1, lastMessage, started: true, ready: true, onHold: false,
});

describe('message cap', () => {
  it('cuts at MAX_MESSAGE_BYTES of UTF-8 without splitting a character, and leaves shorter text alone', () => {
    const cut = boundMessage(wide);
    expect(Buffer.byteLength(cut)).toBeLessThanOrEqual(MAX_MESSAGE_BYTES);
    expect(cut).toMatch(/^é+… \(truncated\)$/);
    expect(boundMessage(cut)).toBe(cut);
    expect(boundMessage('ok')).toBe('ok');
  });

  it('holds on the API for statuses and probe responses', () => {
    expect(Buffer.byteLength(statusToWire(status(wide)).last_message)).toBeLessThanOrEqual(MAX_MESSAGE_BYTES);
    const wire = outcomeToWire({ result: 'success', message: wide, durationSeconds: 0.1, phases: { total: 0.1 } });
    expect(Buffer.byteLength(wire.message)).toBeLessThanOrEqual(MAX_MESSAGE_BYTES);
    expect(statusToWire(status('short')).last_message).toBe('short');
  });
});
