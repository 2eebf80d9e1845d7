"""Prompts of the bash agent, following mini-swe-agent's text protocol.

The protocol (mini-swe-agent, SWE-agent/mini-swe-agent, text-based mode): every model turn is a
THOUGHT followed by exactly one fenced bash block; each block runs in a fresh subshell in the
repository; the observation reports the return code and the output (long output is cut to its
head and tail); the agent finishes by running a command whose output starts with the line
`COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`, and everything printed after that line is the
submission (for SWE tasks, the patch). Wording is ours.
"""
SUBMIT_SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
# ```bash (mini-swe-agent v1) and ```mswea_bash_command (v2 text mode) are both accepted.
ACTION_REGEX = r"```(?:bash|sh|mswea_bash_command)[ \t]*\n(.*?)\n?```"
SUBMIT_COMMAND = f"echo {SUBMIT_SENTINEL} && git add -A && git diff --cached"

SYSTEM_TEMPLATE = """You are a careful software engineer working in a Linux shell on a code repository.

Every reply has two parts: a line starting with THOUGHT: that explains your reasoning, then exactly one fenced bash block holding one command (join several steps with && or ||).

THOUGHT: I should look at the repository layout first.

```bash
ls -la
```

A reply without exactly one bash block is rejected."""

INSTANCE_TEMPLATE = """Please resolve the following issue in the repository at {workdir}.

<issue>
{task}
</issue>

How to work:
1. Find and read the code the issue is about.
2. Reproduce the problem with a small script or test.
3. Change the source code (not the tests) to fix it.
4. Re-run your reproduction and the existing tests to confirm the fix.
5. When you are done, submit by running exactly this command on its own:

```bash
{submit_command}
```

Rules:
- One command per reply. Each command runs in a new subshell whose working directory is {workdir}; `cd` and environment variables do not persist between commands.
- Commands time out after {command_timeout_s} seconds; do not start servers or interactive programs (no vim, less or python without a script).
- Remove scratch files you created before submitting; after the submit command you cannot act any more."""

OBSERVATION_TEMPLATE = """<returncode>{returncode}</returncode>
{exception}{body}"""

OUTPUT_TEMPLATE = """<output>
{output}</output>"""

LONG_OUTPUT_TEMPLATE = """<warning>
The output was {length} characters long, so only its beginning and end are shown. Use a more selective command (grep, head, tail, sed -n 'A,Bp') or write the output to a file and search it.
</warning>
<output_head>
{head}
</output_head>
<elided_chars>
{elided} characters elided
</elided_chars>
<output_tail>
{tail}
</output_tail>"""

FORMAT_ERROR_TEMPLATE = """Format error: {error}

Reply with a THOUGHT: line and then exactly ONE fenced bash block, like this:

THOUGHT: why this command is the next step.

```bash
the_command
```

When the work is finished, submit with `{submit_command}` as the only command."""

TRUNCATED_RESPONSE_TEMPLATE = """Your reply was cut off at the output token limit (finish_reason={finish_reason}) before it contained a complete action. Be brief and give exactly one bash block."""
