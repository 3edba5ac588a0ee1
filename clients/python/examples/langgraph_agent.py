"""A LangGraph agent wired to the Lethe gate: the smallest complete example.

    read_memory -> plan -> tools -> respond

- ``read_memory`` reads the person's memories from the LangGraph store and takes a lease
  listing each item's (memory_id, version);
- ``plan`` asks the model for tool calls; ``tools`` dispatches each under a ``tool`` permit;
- ``respond`` streams the answer's tokens under an ``output`` permit;
- every checkpoint write goes through the gate's checkpointer wrapper (a ``state`` permit, and
  ``lethe_epoch`` plus the tenant and subject keys in its metadata).

If an erasure of the person starts while the run is in flight, the gate pushes the lease's
revocation: the token stream is cut, unflushed tokens are dropped, tools not yet dispatched
never run, and the run ends with ``lethe_gate.Revoked``.

No LLM is reachable here, so the model is scripted (``ScriptedModel``); swap in a chat model's
``.stream()`` and ``.invoke()`` and nothing else changes.

    python examples/langgraph_agent.py --url http://127.0.0.1:7400 --token RUNTIME_TOKEN
    # and, with an operator token, start an erasure of the person after 3 tokens:
    python examples/langgraph_agent.py --url ... --token OPERATOR_TOKEN --erase-after 3
"""

from __future__ import annotations

import argparse
import operator
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore

import lethe_gate
from lethe_gate.langgraph import Gate


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    memories: Annotated[list[str], operator.add]


class ScriptedModel:
    """A stand-in for a chat model. ``pause(i)`` is called before token ``i`` is produced
    (tests block there to revoke at a known point); ``closed`` is set when the stream is
    aborted (what closing a real model's HTTP stream would do)."""

    def __init__(self, pause: Callable[[int], None] | None = None) -> None:
        self.pause = pause
        self.closed = threading.Event()

    def plan(self, memories: list[str]) -> AIMessage:
        return AIMessage(
            content="",
            tool_calls=[
                {"name": "weather", "args": {"city": "Lisbon"}, "id": "call-1"},
                {"name": "calendar", "args": {"day": "friday"}, "id": "call-2"},
            ],
        )

    def stream(self, state: State) -> Iterator[str]:
        words = f"You told me {len(state['memories'])} things; Lisbon is sunny on Friday, enjoy the trip.".split()
        try:
            for i, w in enumerate(words):
                if self.pause is not None:
                    self.pause(i)
                yield w + " "
        finally:
            self.closed.set()


TOOLS: dict[str, Callable[..., Any]] = {
    "weather": lambda city: f"sunny in {city}",
    "calendar": lambda day: f"nothing booked on {day}",
}


def build_graph(gate: Gate, store: BaseStore, model: ScriptedModel, checkpointer, tools=TOOLS):
    def read_memory(state: State, config) -> dict:
        tenant, subject = gate.who(config)
        items = store.search((tenant, subject, "memories"))
        gate.take_lease(config, items)  # binds the epoch and every (memory_id, version) read
        return {"memories": [i.value["text"] for i in items]}

    def plan(state: State, config) -> dict:
        return {"messages": [model.plan(state["memories"])]}

    def run_tools(state: State, config) -> dict:
        return {"messages": gate.dispatch_tools(config, state["messages"][-1].tool_calls, tools)}

    def respond(state: State, config) -> dict:
        emit = get_stream_writer()
        text = gate.stream_tokens(config, model.stream(state), lambda t: emit({"token": t}))
        return {"messages": [AIMessage(content=text)]}

    g = StateGraph(State)
    g.add_node("read_memory", read_memory)
    g.add_node("plan", plan)
    g.add_node("tools", run_tools)
    g.add_node("respond", respond)
    g.add_edge(START, "read_memory")
    g.add_edge("read_memory", "plan")
    g.add_edge("plan", "tools")
    g.add_edge("tools", "respond")
    g.add_edge("respond", END)
    return g.compile(checkpointer=gate.checkpointer(checkpointer), store=store)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="the gate, e.g. http://127.0.0.1:7400")
    ap.add_argument("--token", required=True, help="a runtime (or operator) token")
    ap.add_argument("--tenant", default="acme")
    ap.add_argument("--subject", default="alice")
    ap.add_argument("--erase-after", type=int, metavar="N", help="start an erasure of the person at token N (operator token)")
    args = ap.parse_args()

    client = lethe_gate.GateClient(args.url, args.token)
    gate = Gate(client)
    store = InMemoryStore()
    store.put((args.tenant, args.subject, "memories"), "k1", {"text": "is going to Lisbon"})
    store.put((args.tenant, args.subject, "memories"), "k2", {"text": "likes sunny weather"})

    def pause(i: int) -> None:
        if args.erase_after == i:
            job = client.start_job(args.tenant, args.subject, ticket="EXAMPLE-1")
            print(f"\n[erasure {job['job_id']} started]", file=sys.stderr)
            lease = gate.lease(config)
            lease.revoked.wait(5)  # the push arrives within the gate's 100 ms

    model = ScriptedModel(pause)
    graph = build_graph(gate, store, model, InMemorySaver())
    config = gate.run_config("thread-1", args.tenant, args.subject)
    try:
        for mode, chunk in graph.stream({"messages": [HumanMessage("Weather for my trip?")]}, config, stream_mode=["custom", "updates"]):
            if mode == "custom":
                print(chunk["token"], end="", flush=True)
            else:
                print(f"[{', '.join(chunk)}]", file=sys.stderr)
        print()
        return 0
    except lethe_gate.Refused as e:
        print(f"\n[run aborted by the gate: {e.code}; model stream closed: {model.closed.is_set()}]", file=sys.stderr)
        return 3
    finally:
        gate.end_run("thread-1")
        client.close()


if __name__ == "__main__":
    sys.exit(main())
