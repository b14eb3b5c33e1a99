/** vitest setup file (see vitest.config.ts): strips the caller's PROBE_AGENT_* variables, see suite-env.ts. */
import { stripAgentVariables } from './suite-env.ts';

stripAgentVariables(process.env);
