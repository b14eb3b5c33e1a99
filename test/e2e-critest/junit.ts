/**
 * Reads the JUnit reports of ginkgo v2 (critest's -ginkgo.junit-report) and compares two runs spec
 * by spec. Only what the comparison needs is parsed: each <testcase>'s name, its `status` attribute
 * (ginkgo's SpecState: passed, skipped, failed, timedout, panicked, ...) and the first line of its
 * failure message. Suite nodes ([BeforeSuite], [SynchronizedAfterSuite], ...) count as specs too:
 * they can fail.
 */

/** How one spec ended. */
export interface SpecResult {
  name: string;
  status: string;
  /** First line of the failure or error message ('' when it passed or was skipped). */
  message: string;
  seconds: number;
}

/** The outcome class the comparison uses: what "ended the same way" means. */
export type Outcome = 'passed' | 'failed' | 'skipped';

export function outcomeOf(status: string): Outcome {
  if (status === 'passed') return 'passed';
  if (status === 'skipped' || status === 'pending') return 'skipped';
  return 'failed';
}

const ENTITIES: Record<string, string> = { amp: '&', lt: '<', gt: '>', quot: '"', apos: "'" };

function unescapeXml(s: string): string {
  return s.replace(/&(#x[0-9a-fA-F]+|#\d+|\w+);/g, (m, e: string) => {
    if (e.startsWith('#x')) return String.fromCodePoint(parseInt(e.slice(2), 16));
    if (e.startsWith('#')) return String.fromCodePoint(Number(e.slice(1)));
    return ENTITIES[e] ?? m;
  });
}

function attr(tag: string, name: string): string | undefined {
  const m = new RegExp(`\\s${name}="([^"]*)"`).exec(tag);
  return m ? unescapeXml(m[1]!) : undefined;
}

/** The specs of a JUnit report, in report order. */
export function parseJUnit(xml: string): SpecResult[] {
  const out: SpecResult[] = [];
  // A testcase is self-closing or runs to its </testcase>; encoding/xml escapes '>' in attribute
  // values, so a tag ends at its first '>'.
  const re = /<testcase\b([^>]*?)(\/>|>([\s\S]*?)<\/testcase>)/g;
  for (let m = re.exec(xml); m; m = re.exec(xml)) {
    const open = m[1]!;
    const body = m[3] ?? '';
    const name = attr(open, 'name') ?? '';
    let status = attr(open, 'status');
    const fail = /<(failure|error)\b([^>]*)>/.exec(body);
    // A report without ginkgo's status attribute: the JUnit elements say it.
    if (status === undefined) status = fail ? 'failed' : /<skipped\b/.test(body) ? 'skipped' : 'passed';
    const message = fail ? (attr(fail[2]!, 'message') ?? '').split('\n').find((l) => l.trim() !== '')?.trim() ?? '' : '';
    out.push({ name, status, message, seconds: Number(attr(open, 'time') ?? 0) });
  }
  return out;
}

/** Counts by outcome. */
export function countOutcomes(specs: SpecResult[]): Record<Outcome, number> & { total: number } {
  const c = { total: specs.length, passed: 0, failed: 0, skipped: 0 };
  for (const s of specs) c[outcomeOf(s.status)]++;
  return c;
}

/** One spec that did not end the same way in both runs (absent from a run: undefined). */
export interface SpecDifference {
  name: string;
  a: SpecResult | undefined;
  b: SpecResult | undefined;
}

/** The specs whose outcome differs between run a and run b, or that only one run has. */
export function compareRuns(a: SpecResult[], b: SpecResult[]): SpecDifference[] {
  // A name that occurs twice in a report (not expected of ginkgo) is told apart by its occurrence.
  const byName = (l: SpecResult[]): Map<string, SpecResult> => {
    const m = new Map<string, SpecResult>();
    for (const s of l) {
      let key = s.name;
      for (let n = 2; m.has(key); n++) key = `${s.name} #${n}`;
      m.set(key, s);
    }
    return m;
  };
  const ma = byName(a);
  const mb = byName(b);
  const names = [...new Set([...ma.keys(), ...mb.keys()])].sort();
  const diffs: SpecDifference[] = [];
  for (const name of names) {
    const sa = ma.get(name);
    const sb = mb.get(name);
    if (!sa || !sb || outcomeOf(sa.status) !== outcomeOf(sb.status)) diffs.push({ name, a: sa, b: sb });
  }
  return diffs;
}
