/** `make e2e-critest`'s comparison of two ginkgo JUnit reports (test/e2e-critest/junit.ts). */
import { describe, expect, it } from 'vitest';
import { compareRuns, countOutcomes, parseJUnit } from '../e2e-critest/junit.ts';

// The shape ginkgo v2.9's reporters.GenerateJUnitReport writes (critest v1.26), trimmed.
const report = (cases: string): string => `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="4" disabled="0" errors="0" failures="1" time="12.5">
  <testsuite name="CRI validation" package="/x" tests="4" disabled="0" skipped="1" errors="0" failures="1" time="12.5">
${cases}
  </testsuite>
</testsuites>`;

const A = report(`
    <testcase name="[BeforeSuite]" classname="CRI validation" status="passed" time="0.01"></testcase>
    <testcase name="[It] [k8s.io] Container Mount Propagation runtime should support mount propagation mount with &#39;rshared&#39; should support propagation from host to container and vice versa" classname="CRI validation" status="passed" time="3.2">
      <system-out>Report Entries:</system-out>
    </testcase>
    <testcase name="[It] [k8s.io] Networking runtime should support networking runtime should support port mapping with host port and container port [Conformance]" classname="CRI validation" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[It] [k8s.io] Image Manager public image with digest should be pulled and removed [Conformance]" classname="CRI validation" status="failed" time="1.1">
      <failure message="failed to pull image: rpc error: code = NotFound&#xA;more" type="failed">[FAILED] ...</failure>
    </testcase>`);

describe('critest JUnit reports', () => {
  it('reads each spec with ginkgo\'s status, unescaped name and the first line of its failure', () => {
    const specs = parseJUnit(A);
    expect(specs.map((s) => s.status)).toEqual(['passed', 'passed', 'skipped', 'failed']);
    expect(specs[1]!.name).toContain("mount with 'rshared' should support");
    expect(specs[3]!.message).toBe('failed to pull image: rpc error: code = NotFound');
    expect(countOutcomes(specs)).toEqual({ total: 4, passed: 2, failed: 1, skipped: 1 });
  });

  it('finds no difference between runs that ended every spec the same way, failures included', () => {
    const b = A.replace('time="3.2"', 'time="4.0"').replace('code = NotFound', 'code = Unknown');
    expect(compareRuns(parseJUnit(A), parseJUnit(b))).toEqual([]);
  });

  it('reports a spec that ended otherwise, or that only one run has', () => {
    const b = A.replace('status="passed" time="3.2"', 'status="timedout" time="3.2"')
      .replace(/<testcase name="\[BeforeSuite\]"[^>]*><\/testcase>/, '');
    const diffs = compareRuns(parseJUnit(A), parseJUnit(b));
    expect(diffs.map((d) => [d.name.slice(0, 41), d.a?.status, d.b?.status])).toEqual([
      ['[BeforeSuite]', 'passed', undefined],
      ['[It] [k8s.io] Container Mount Propagation', 'passed', 'timedout'],
    ]);
  });

  it('reads a report without ginkgo\'s status attribute from its JUnit elements', () => {
    const plain = report(`<testcase name="a" time="1"/><testcase name="b" time="1"><skipped/></testcase><testcase name="c" time="1"><error message="x"/></testcase>`);
    expect(parseJUnit(plain).map((s) => [s.name, s.status])).toEqual([['a', 'passed'], ['b', 'skipped'], ['c', 'failed']]);
  });
});
