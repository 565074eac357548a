"""The gains the reference pass records (ir.Gains) weigh each rounding on its way to the output."""
from preclint.ir import Gains, Kind, Node
from preclint.predict import propagated_error


def test_a_constants_exact_rounding_is_what_reaches_the_output():
    """A constant whose rounding errors are known exactly (Gains.rounding) puts that error on the
    output; its result-rounding estimate is only for values downstream of it with other gains."""
    node = Node("c", Kind.CONSTANT, "torch.arange", fn="arange")
    node.put(Gains(out=4.0, rounding={"fp16": 1e-6}))
    terms = {"result": 1e-3, "result_to_output": 1e-6}
    assert propagated_error(node, terms, None) == 1e-6
    assert propagated_error(node, terms, (9.0, None)) == (1e-3) ** 2 * 9.0


def test_a_node_without_gains_adds_nothing():
    node = Node("x", Kind.ELEMENTWISE, "operator.add", fn="add")
    assert propagated_error(node, {"result": 1e-3}, None) == 0.0
    assert propagated_error(node, {"result": 1e-3}, (2.0, None)) == (1e-3) ** 2 * 2.0
