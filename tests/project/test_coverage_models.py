"""benchmarks/coverage.py: the families issue 26 tried are in the benchmark, and findings located
outside the model's file and its layers' libraries are counted."""
from benchmarks import coverage

ISSUE_26 = ["resnext50_32x4d", "fasterrcnn_resnet50_fpn", "timm/eva02_tiny_patch14_224", "timm/fastvit_t8",
            "timm/efficientvit_b0", "timm/maxvit_nano_rw_256", "timm/nf_resnet26", "hf/qwen2", "hf/mistral",
            "hf/gemma2", "hf/phi3", "hf/mixtral", "hf/mamba", "hf/dinov2", "hf/wav2vec2", "hf/detr", "hf/segformer"]


def test_the_issue_families_have_model_files():
    for name in ISSUE_26:
        suite, _, source = coverage.model_file(name, 128)
        assert "model =" in source and suite in ("torchvision", "timm", "hf")
    assert set(ISSUE_26) - {"fasterrcnn_resnet50_fpn", "hf/mixtral", "hf/wav2vec2", "hf/detr"} <= set(coverage.REPRESENTATIVE)


def test_misplaced_findings_are_those_outside_the_model_file_and_its_libraries():
    report = {"model": "hf__gemma2.py:model", "findings": [
        {"location": {"path": "hf__gemma2.py", "line": 4}},
        {"location": {"path": "transformers/models/gemma2/modeling_gemma2.py", "line": 9, "library": True}},
        {"location": {"path": "../../bin/preclint", "line": 8}},  # the launcher: sys.exit(main())
        {"location": {"path": "preclint/capture/fx_capture.py", "line": 3, "library": True}},
        {"location": None},
    ]}
    assert coverage.misplaced_findings(report) == 2


def probe_report(**modes):
    return {"summary": {mode: {"predicted_output": {"rel_error": p}, "measured_output": {"rel_error": m}}
                        for mode, (p, m) in modes.items()}}


def test_predicted_and_measured_are_recorded_per_precision_with_their_factor():
    from benchmarks.coverage_accuracy import report_accuracy

    rows = report_accuracy(probe_report(tf32=(1.3e-3, 6.4e-3), fp16=(4e-4, 5e-4), bf16=(1e-8, 3e-8)))
    assert rows["tf32"] == {"predicted": 1.3e-3, "measured": 6.4e-3, "measured_over_predicted": 4.923, "factor": 4.923}
    assert rows["fp16"]["factor"] == 1.25
    assert rows["bf16"]["factor"] == 1.0  # both float32 noise: they agree
    unmeasured = probe_report(fp16=(4e-4, None))
    assert report_accuracy(unmeasured) == {}


def test_a_model_with_several_outputs_is_judged_by_its_worst_output():
    from benchmarks.coverage_accuracy import report_accuracy

    report = probe_report(fp16=(1e-3, 1e-3))
    report["summary"]["fp16"]["outputs"] = [{"output": "0", "rel_error": 1e-3}, {"output": "1", "rel_error": 1e-4}]
    report["summary"]["fp16"]["measured_output"]["outputs"] = [{"rel_error": 1e-3}, {"rel_error": 8e-4}]
    row = report_accuracy(report)["fp16"]
    assert [o["factor"] for o in row["outputs"]] == [1.0, 8.0] and row["factor"] == 8.0
    assert row["factor_overall"] == 1.0


def test_the_summary_gives_the_share_within_3x_and_the_pairs_outside():
    from benchmarks.coverage_accuracy import report_accuracy, summarize_accuracy

    entries = [{"model": "a", "probe_cpu": {"accuracy": report_accuracy(probe_report(tf32=(1e-3, 1.1e-3), fp16=(0, 1e-3)))}},
               {"model": "b", "probe_cpu": {"accuracy": report_accuracy(probe_report(bf16=(1e-2, 2e-3)))}},
               {"model": "c", "probe_cpu": {"status": "timeout"}}]
    summary = summarize_accuracy(entries, "probe_cpu")
    assert (summary["pairs"], summary["within_3x"], summary["within_3x_fraction"]) == (3, 1, 0.3333)
    assert [(p["model"], p["mode"]) for p in summary["outside_3x"]] == [("a", "fp16"), ("b", "bf16")]


def test_both_kinds_of_mismatch_note_are_recorded():
    """probe/mismatch.py words a note for the outputs together and one for a single output differently;
    the benchmark keeps both (it once kept only the first, and the H200 run lost wav2vec2's)."""
    report = {"summary": {}, "notes": [
        "probe: tf32 measured an output error of 3.1e-3 against 2.0e-4 predicted (15.5x the prediction).",
        "probe: tf32 measured output['extract_features'] with an error of 3.3e-7 against 5.0e-4 predicted "
        "(1500.0x below the prediction), though the outputs together lie within 3x.",
        "probe: the reference ran in float32 (TF32 off)",
    ]}
    assert [n[:40] for n in coverage.report_figures(report)["mismatch_notes"]] == [
        "probe: tf32 measured an output error of ", "probe: tf32 measured output['extract_fea"]
