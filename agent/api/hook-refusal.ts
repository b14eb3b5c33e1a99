/**
 * How the agent tells the shim "I did not start this hook; ask again": the contract both sides
 * share so that a hook refused during a drain is retried, and a hook that may have run is not.
 * Kept free of imports: the shim loads it too.
 */

/** Trailer the agent sets on a RunLifecycleHandler it refused before starting it. */
export const NOT_STARTED_TRAILER = 'probe-agent-not-started';

/** Its value when the agent is draining (SIGTERM): the hook was not started; another agent will take it. */
export const NOT_STARTED_DRAINING = 'draining';

/** The gRPC status detail of that refusal (status UNAVAILABLE), documented in docs/closing-the-hole.md. */
export const DRAINING_DETAIL = 'probe-agent is draining: the hook was not started';
