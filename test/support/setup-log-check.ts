/**
 * vitest setup file (see vitest.config.ts): once a test file is done (after its own afterAll
 * hooks, which stop what it started), fails it when an agent or shim it ran through the harnesses
 * logged a warn/error line the test did not list as provoked on purpose (log-check.ts).
 */
import { afterAll, expect } from 'vitest';
import { assertTrackedLogsClean } from './log-check.ts';

afterAll(() => {
  assertTrackedLogsClean(expect.getState().testPath ?? '');
});
