/**
 * What the agent's refusals tell the shim: "I did not start this hook; ask again" (so that a hook
 * refused during a drain is retried, and a hook that may have run is not), and "this command is
 * unreadable" (for the shim's counters). Free of imports: both sides load it.
 */

/** Trailer the agent sets on a RunLifecycleHandler it refused before starting it. */
export const NOT_STARTED_TRAILER = 'probe-agent-not-started';

/** Its value when the agent is draining (SIGTERM): the hook was not started; another agent will take it. */
export const NOT_STARTED_DRAINING = 'draining';

/** The gRPC status detail of that refusal (status UNAVAILABLE), documented in docs/closing-the-hole.md. */
export const DRAINING_DETAIL = 'probe-agent is draining: the hook was not started';

/**
 * How every ExecSync refusal of a rewritten command the agent cannot read (malformed, another
 * command, kind and timeout disagreeing) begins (status INVALID_ARGUMENT): the shim counts those as
 * `bad_command`, apart from refusals of a well-formed command.
 */
export const INVALID_COMMAND_PREFIX = 'probe-agent: invalid rewritten command: ';
