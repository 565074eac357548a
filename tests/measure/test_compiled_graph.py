"""Reading what Inductor made of a model: module paths, kernels, removed roundings, kept float32
(no compilation here: the records are built as measure/compiled_graph.py reads them)."""
from preclint.measure.compiled_graph import (CompiledNode, KeptSite, elided_roundings, float_calls, foreign_dtypes,
                                             kept_float32_lost, module_path, read_kernels, reduced_user_casts)


def test_dynamo_module_paths_read_as_named_modules_spells_them():
    assert module_path("L['self'].layers[0].attn") == "layers.0.attn"
    assert module_path("L['self']._modules['layers']._modules['0'].mlp") == "layers.0.mlp"
    assert module_path("getattr(L['self'].encoder.layer, '3').output") == "encoder.layer.3.output"
    assert module_path("L['self']") == ""


WRAPPER = '''
        buf0 = empty_strided_cpu((32, 64), (64, 1), torch.bfloat16)
        # Topologically Sorted Source Nodes: [y], Original ATen: [aten._to_copy, aten.t, aten.addmm]
        extern_kernels.addmm(buf2, buf0, reinterpret_tensor(buf1, (64, 64), (1, 64), 0), alpha=1, beta=1, out=buf3)
        # Topologically Sorted Source Nodes: [mul, add, tanh, z], Original ATen: [aten.mul, aten.add, aten.tanh]
        cpp_fused_add_mul_tanh_1(buf3, buf4)
        del buf3
        cpp_fused__to_copy_abs_div_3(buf4, buf6)
        # Topologically Sorted Source Nodes: [softmax], Original ATen: [aten._softmax]
        triton_per_fused__softmax_2.run(buf4, buf5, 32, 64, stream=stream0)
'''


def test_kernels_are_read_with_the_source_nodes_they_fuse():
    kernels = read_kernels(WRAPPER)
    assert [k.name for k in kernels] == ["extern_kernels.addmm", "cpp_fused_add_mul_tanh_1", "cpp_fused__to_copy_abs_div_3",
                                         "triton_per_fused__softmax_2"]
    assert [k.fused for k in kernels] == [False, True, True, True]
    assert kernels[2].sources == ()  # the C++ wrapper comments only some kernels
    assert kernels[1].sources == ("mul", "add", "tanh", "z")
    assert kernels[1].aten == ("aten.mul", "aten.add", "aten.tanh")


def _node(name, role, dtype, users=(), inputs=(), **kw):
    op = kw.pop("op", name.rstrip("_0123456789"))
    return CompiledNode(name, op, kw.pop("original", op), role, dtype, users=tuple(users), inputs=tuple(inputs), **kw)


def _chain():
    """addmm (bf16) -> mul -> tanh -> add (each bf16) -> addmm: the eager roundings of mul and tanh
    happen inside one fused kernel; add is stored for the next product."""
    return [
        _node("addmm", "product", "bfloat16", users=("mul",)),
        _node("mul", "pointwise", "bfloat16", users=("tanh",), inputs=("addmm",)),
        _node("tanh", "pointwise", "bfloat16", users=("add",), inputs=("mul",)),
        _node("add", "pointwise", "bfloat16", users=("addmm_1",), inputs=("tanh",)),
        _node("addmm_1", "product", "bfloat16", users=("output",), inputs=("add",)),
        _node("output", "output", None, inputs=("addmm_1",)),
    ]


def test_roundings_inside_a_fused_chain_are_the_ones_removed():
    assert [n.name for n in elided_roundings(_chain())] == ["mul", "tanh"]


def test_float32_values_have_no_rounding_to_remove():
    nodes = [_node("mul", "pointwise", "float32", users=("tanh",)), _node("tanh", "pointwise", "float32", users=("out",)),
             _node("out", "output", None)]
    assert elided_roundings(nodes) == []


def test_a_reduced_format_only_the_compiled_graph_uses_is_foreign():
    # a graph compiled under bfloat16 autocast, served to a float16 run (pytorch PR 181564)
    assert foreign_dtypes({"bfloat16": 12, "float32": 3}, {"float16", "float32"}) == ["bfloat16"]
    assert foreign_dtypes({"float16": 12, "float32": 3}, {"float16", "float32"}) == []


def test_a_kept_region_is_lost_where_its_ops_compute_in_a_reduced_format():
    here = ("/src/model.py", 12)
    site = KeptSite("autocast(enabled=False) region", "/src/model.py", 12, (("/src/model.py", 12, "softmax"),))
    kept = [_node("exp", "pointwise", "float32", original="_softmax", frames=(here,)),
            _node("sum", "reduction", "float32", original="_softmax", frames=(here,))]
    assert kept_float32_lost(kept, site) == ([], 2)
    lost = [_node("exp", "pointwise", "bfloat16", original="_softmax", frames=(here,))]
    assert [n.name for n in kept_float32_lost(lost, site)[0]] == ["exp"]
    # an op of another line is not the region's
    elsewhere = [_node("exp", "pointwise", "bfloat16", original="_softmax", frames=(("/src/model.py", 30),))]
    assert kept_float32_lost(elsewhere, site) == ([], 0)


def test_a_kept_module_is_found_by_the_module_that_owns_its_ops():
    site = KeptSite("the plan's kept module 'norm'", "/src/model.py", 5, (), module="norm")
    nodes = [_node("mean", "reduction", "bfloat16", module="norm"), _node("mul", "pointwise", "bfloat16", module="normal")]
    lost, held = kept_float32_lost(nodes, site)
    assert [n.name for n in lost] == ["mean"] and held == 1


def test_float_calls_are_checked_through_views():
    nodes = [
        _node("float_1", "cast", "float32", users=("view",), op="convert_element_type", input_dtype="bfloat16",
              source_fn="float"),
        _node("view", "view", "float32", users=("exp",)),
        _node("exp", "pointwise", "bfloat16", users=()),
    ]
    ((cast, lost, readers),) = float_calls(nodes)
    assert cast.name == "float_1" and [n.name for n in lost] == ["exp"] and readers == 1


def test_only_the_codes_own_casts_count_not_autocasts():
    nodes = [
        _node("c0", "cast", "bfloat16", users=("addmm",), op="convert_element_type", input_dtype="float32",
              source_fn="Linear"),
        _node("addmm", "product", "bfloat16", users=("c1",)),
        _node("c1", "cast", "bfloat16", users=("c2",), op="convert_element_type", input_dtype="float32", source_fn="to"),
        _node("c2", "cast", "float32", users=("mul",), op="convert_element_type", input_dtype="bfloat16",
              source_fn="float"),
        _node("mul", "pointwise", "float32", users=()),
    ]
    assert [(n.name, elided) for n, elided in reduced_user_casts(nodes)] == [("c1", True)]
