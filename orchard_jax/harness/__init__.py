"""Agent loops that act in sandboxes and reach the model over HTTP.

Public API:
  BashAgent, AgentConfig, AgentResult, run_agent   mini-swe-agent-protocol bash agent
  ChatModel                                        OpenAI-compatible chat client (httpx)
  ToolAgent, ToolAgentConfig, ToolAgentResult      ReAct agent over OpenAI function calling
The harnesses know no task domain: SWE's replay expert and episode live in tasks/swe.
"""
from orchard_jax.harness.bash_agent import AgentConfig, AgentResult, BashAgent, run_agent
from orchard_jax.harness.errors import HarnessError, ModelCallError
from orchard_jax.harness.model_client import ChatModel
from orchard_jax.harness.tool_agent import ToolAgent, ToolAgentConfig, ToolAgentResult
