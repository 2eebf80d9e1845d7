"""Agent loops that act in sandboxes and reach the model over HTTP.

Public API:
  BashAgent, AgentConfig, AgentResult, run_agent   mini-swe-agent-protocol bash agent
  ChatModel                                        OpenAI-compatible chat client (httpx)
  run_expert, plan_steps, VARIANTS, ExpertRun      the replay expert (gold-patch trajectories)
  ToolAgent, ToolAgentConfig, ToolAgentResult      ReAct agent over OpenAI function calling
"""
from orchard_jax.harness.bash_agent import AgentConfig, AgentResult, BashAgent, run_agent
from orchard_jax.harness.errors import HarnessError, ModelCallError
from orchard_jax.harness.model_client import ChatModel
from orchard_jax.harness.replay_expert import VARIANTS, ExpertRun, plan_steps, run_expert
from orchard_jax.harness.tool_agent import ToolAgent, ToolAgentConfig, ToolAgentResult
