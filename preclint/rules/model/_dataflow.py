"""Walking the graph's data flow: who reads a value (through ops that only move it), and where it
came from. Shared by the rules that judge a value by what is done with it."""
from __future__ import annotations

from typing import Callable, Dict, Iterator, List, Set, Tuple

from preclint.core.ir import Graph, Kind, Node

# ops that move or select values without arithmetic: a value keeps its meaning through them
MOVES = frozenset({Kind.SHAPE})


def users_by_input(graph: Graph) -> Dict[str, List[Tuple[Node, int]]]:
    """name -> [(user, position of the name among the user's inputs)], built once for a graph."""
    users: Dict[str, List[Tuple[Node, int]]] = {}
    for node in graph.nodes:
        for i, name in enumerate(node.inputs):
            users.setdefault(name, []).append((node, i))
    return users


def readers(users: Dict[str, List[Tuple[Node, int]]], name: str, through=MOVES) -> Iterator[Tuple[Node, int]]:
    """The ops that read the value of ``name``, looking through reshapes, views and the like."""
    seen: Set[str] = set()
    frontier = [name]
    while frontier:
        current = frontier.pop()
        for user, position in users.get(current, []):
            if user.name in seen:
                continue
            seen.add(user.name)
            if user.kind in through:
                frontier.append(user.name)
            else:
                yield user, position


def downstream(users: Dict[str, List[Tuple[Node, int]]], name: str,
               follow: Callable[[Node], bool]) -> Iterator[Tuple[Node, int]]:
    """Each reader of ``name`` once, and the readers of every reader that ``follow`` accepts: how a
    value's use is traced through a chain of ops (an eps through add/clamp to the sqrt it guards)."""
    frontier, seen = [name], set()
    while frontier:
        for user, position in readers(users, frontier.pop()):
            if user.name in seen:
                continue
            seen.add(user.name)
            yield user, position
            if follow(user):
                frontier.append(user.name)


def ancestors(graph: Graph, name: str) -> Set[str]:
    """Every node whose value flows into ``name``."""
    found: Set[str] = set()
    frontier = list(graph[name].inputs) if graph.get(name) is not None else []
    while frontier:
        current = frontier.pop()
        if current in found or graph.get(current) is None:
            continue
        found.add(current)
        frontier.extend(graph[current].inputs)
    return found
