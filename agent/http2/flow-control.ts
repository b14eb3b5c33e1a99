/**
 * HTTP/2 flow control of one connection (RFC 9113 5.2, 6.9): both connection windows and the rules
 * for each stream's, kept in the stream's own state (StreamWindows) so that no frame allocates.
 *
 *  - Sending: DATA takes what the peer's connection and stream windows and its frame size allow
 *    (`room`), and is charged to both (`charge`). The peer's WINDOW_UPDATE opens them: 0 is a
 *    PROTOCOL_ERROR, a window beyond 2^31-1 a FLOW_CONTROL_ERROR (on the connection, a connection
 *    error; on a stream, a stream error). Its SETTINGS_INITIAL_WINDOW_SIZE moves every open
 *    stream's window by the change (6.9.2), below zero too; beyond 2^31-1 is a connection error.
 *  - Receiving: DATA beyond our connection window is a FLOW_CONTROL_ERROR. What the owner consumed
 *    goes back on the connection in batches (`connectionCredit`), and on a stream once the peer has
 *    half the window we advertise or less (`refill`, as nghttp2). A change of the initial window
 *    we advertise moves every open stream's receive window (`localInitialWindow`).
 *
 * The core (connection.ts) sends the WINDOW_UPDATE frames these rules ask for.
 */
import { DEFAULT_WINDOW, H2ConnectionError, H2Error, MAX_WINDOW } from './wire.ts';

/** A stream's windows, kept in the core's stream state. */
export interface StreamWindows {
  /** What the peer lets us send on it. */
  sendWindow: number;
  /** What the peer may still send on it (our advertised initial window, its DATA, our updates). */
  recvWindow: number;
  /** Octets the owner read on it whose stream window is not yet given back. */
  unacked: number;
}

/** SETTINGS_INITIAL_WINDOW_SIZE beyond 2^31-1 is a connection error (RFC 9113 6.5.2). Throws H2ConnectionError. */
export function checkInitialWindowSize(v: number): void {
  if (v > MAX_WINDOW) throw new H2ConnectionError(H2Error.FLOW_CONTROL_ERROR, `SETTINGS_INITIAL_WINDOW_SIZE ${v} beyond 2^31-1`);
}

/** Consumed octets given back on the connection with other output, rather than waiting for a batch. */
const PIGGYBACK_CREDIT = 4096;

/** One connection's windows. */
export class FlowControl {
  /** The peer's connection window (what we may still send). */
  sendWindow = DEFAULT_WINDOW;
  /** Our connection window (what the peer may still send). */
  recvWindow: number;
  /** Octets consumed on the connection but not yet given back. */
  unacked = 0;
  /** Connection-window octets given back at once, rather than batched with other output. */
  readonly creditBatch: number;
  /** The WINDOW_UPDATE our preface carries to open the connection window beyond the default (0: none). */
  readonly prefaceIncrement: number;

  /** `connectionWindow`: our connection receive window; `creditBatch` default a quarter of it (at least 16 KiB). */
  constructor(connectionWindow: number, creditBatch?: number) {
    this.recvWindow = connectionWindow;
    this.prefaceIncrement = connectionWindow > DEFAULT_WINDOW ? connectionWindow - DEFAULT_WINDOW : 0;
    this.creditBatch = creditBatch ?? Math.max(16_384, connectionWindow >>> 2);
  }

  // ---- sending ----

  /** Octets of DATA that may go on `s` now, in one frame of at most `maxFrame`. */
  room(s: StreamWindows, maxFrame: number): number {
    return Math.min(this.sendWindow, s.sendWindow, maxFrame);
  }

  /** Charges `n` octets of DATA sent on `s` to both windows. */
  charge(s: StreamWindows, n: number): void {
    this.sendWindow -= n;
    s.sendWindow -= n;
  }

  /** The peer's WINDOW_UPDATE on the connection. Throws H2ConnectionError. */
  connectionUpdate(increment: number): void {
    if (increment === 0) throw new H2ConnectionError(H2Error.PROTOCOL_ERROR, 'WINDOW_UPDATE of 0 on the connection');
    this.sendWindow += increment;
    if (this.sendWindow > MAX_WINDOW) throw new H2ConnectionError(H2Error.FLOW_CONTROL_ERROR, 'connection window beyond 2^31-1');
  }

  /** The peer's WINDOW_UPDATE on stream `s`: 0 when applied, else the code of the stream error it is. */
  streamUpdate(s: StreamWindows, increment: number): number {
    if (increment === 0) return H2Error.PROTOCOL_ERROR;
    s.sendWindow += increment;
    return s.sendWindow > MAX_WINDOW ? H2Error.FLOW_CONTROL_ERROR : 0;
  }

  /** The peer's SETTINGS_INITIAL_WINDOW_SIZE changed by `delta`: every open stream's send window moves with it. Throws H2ConnectionError. */
  peerInitialWindow(streams: Iterable<StreamWindows>, delta: number): void {
    for (const s of streams) {
      s.sendWindow += delta;
      if (s.sendWindow > MAX_WINDOW) throw new H2ConnectionError(H2Error.FLOW_CONTROL_ERROR, 'SETTINGS_INITIAL_WINDOW_SIZE overflows a stream window');
    }
  }

  // ---- receiving ----

  /** DATA of `n` flow-controlled octets arrived on the connection. Throws H2ConnectionError. */
  received(n: number): void {
    if (n > this.recvWindow) throw new H2ConnectionError(H2Error.FLOW_CONTROL_ERROR, `DATA beyond the connection window (${n} > ${this.recvWindow})`);
    this.recvWindow -= n;
  }

  /** `n` octets of it were on the open stream `s`. */
  receivedOn(s: StreamWindows, n: number): void {
    s.recvWindow -= n;
  }

  /** The owner consumed `octets` of the connection's DATA (and of `s`'s, when given); true when a batch is due. */
  consumed(octets: number, s?: StreamWindows): boolean {
    this.unacked += octets;
    if (s !== undefined) s.unacked += octets;
    return this.unacked >= this.creditBatch;
  }

  /**
   * The connection credit to send now (applied to our window; 0: none): a full batch, or a smaller
   * one when other output goes anyway (`withOutput`).
   */
  connectionCredit(withOutput: boolean): number {
    const n = this.unacked;
    if (n === 0 || (n < this.creditBatch && !(withOutput && n >= PIGGYBACK_CREDIT))) return 0;
    this.recvWindow += n;
    this.unacked = 0;
    return n;
  }

  /**
   * The one stream-window refill rule: what the owner read on `s` goes back once the peer has half
   * the window we advertise (`localInitial`) left or less, while it still sends (`remoteEnded`
   * false). Returns the increment to send (applied), or 0.
   */
  refill(s: StreamWindows, localInitial: number, remoteEnded: boolean): number {
    if (s.unacked === 0 || remoteEnded || s.recvWindow > localInitial >>> 1) return 0;
    const n = s.unacked;
    s.recvWindow += n;
    s.unacked = 0;
    return n;
  }

  /** We grant `increment` more on `s` (a WINDOW_UPDATE the owner sends). */
  grant(s: StreamWindows, increment: number): void {
    s.recvWindow += increment;
  }

  /** The initial window we advertise changed by `delta`: an open stream's receive window moves with it (6.9.2). */
  localInitialWindow(s: StreamWindows, delta: number): void {
    s.recvWindow += delta;
  }
}
