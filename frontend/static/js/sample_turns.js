// The sample browser's view of a multi-turn episode (pure: no DOM, run in node by the tests): a sample's
// turns (the policy's and the environment's messages, in order: its `turns`) as rows to draw.

/** Who spoke a turn: the policy (role "assistant") or the environment (its message's role). */
export function turnSpeaker(role) {
  if (role === "assistant") return "policy";
  return role === "tool" ? "environment · tool" : "environment · user";
}

/** One line under a turn's speaker: its tokens and, for a policy turn, the mean behaviour log-prob. */
export function turnSummary(turn) {
  const n = Number.isInteger(turn.tokens) ? turn.tokens : 0;
  const parts = [`${n} token${n === 1 ? "" : "s"}`];
  if (turn.role === "assistant" && typeof turn.logprob_mean === "number") {
    parts.push(`mean log-prob ${turn.logprob_mean.toFixed(3)}`);
  }
  return parts.join(" · ");
}

/** A sample's turns as rows ({index, role, policy, speaker, summary, text}); [] for a sample without
 * turns (one prompt, one response: the browser shows its response as it is). */
export function turnRows(turns) {
  if (!Array.isArray(turns)) return [];
  return turns
    .filter((t) => t && typeof t === "object")
    .map((t, i) => ({
      index: i + 1,
      role: String(t.role),
      policy: t.role === "assistant",
      speaker: turnSpeaker(t.role),
      summary: turnSummary(t),
      text: t.text === null || t.text === undefined ? "" : String(t.text),
    }));
}
