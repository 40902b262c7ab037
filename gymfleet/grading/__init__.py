"""The environment author's toolkit: answer extraction, math equivalence, text and tool-call helpers, the judge
client, the sandbox client, the process pool, reward probes."""
