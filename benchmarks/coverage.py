"""Does `preclint check` (and `--probe`) run on every model a user brings?

Three suites of models, random weights, nothing downloaded: every model of
``torchvision.models.list_models()`` (``weights=None``), a sample of timm families
(``pretrained=False``) and a sample of Hugging Face transformers families built from small configs.
Each model is written to a small model file, as a user would give it, with an input that runs in
seconds on a CPU, and checked by the CLI in a subprocess of its own with a timeout; each probe
(``--probe cpu``, the CPU emulation, and ``--probe cuda`` on a GPU machine) runs after a check
that succeeded. Per model and command it records the exit code, the wall time, the peak RSS of the
child, the capture path (fx or function-mode), the findings by code, the static findings the probe
refuted and, for a failure, its class and the last line the command printed. A signal, a traceback
("internal error") or a timeout is a bug of preclint; an exit code of 2 with one line is preclint
saying what it could not do.

    python benchmarks/coverage.py --out run.json --jobs 1
    python benchmarks/coverage.py --suites timm,hf --no-probe
    python benchmarks/coverage.py --models resnet18,timm/levit_128s,hf/t5 --device cuda
    python benchmarks/coverage.py --compare before.json after.json
    python benchmarks/coverage.py --markdown benchmarks/results/coverage_*.json

``--time-budget SECONDS`` stops cleanly: no command starts after it, a command still running then is
ended and recorded as cut, and the models never reached are listed in the results.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Tuple

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.coverage_accuracy import report_accuracy, summarize_accuracy  # noqa: E402
from benchmarks.provenance import stamp  # noqa: E402

SUITES = ("torchvision", "timm", "hf")
PROBE_ONLY = "PCL900"  # the probe's own finding (a hot spot no rule flagged): not a static one

# torchvision inputs by family: small enough for seconds on a CPU, large enough for every architecture.
# ViT, MaxViT and MViT embed positions for one input size, S3D pools a fixed window at the end;
# RAFT needs sides divisible by 8.
IMAGE = "torch.rand(1, 3, 64, 64)"
FIXED_224 = "torch.rand(1, 3, 224, 224)"
SPECIAL_INPUTS = {
    "inception_v3": "torch.rand(1, 3, 96, 96)",  # 75x75 at least
    "quantized_inception_v3": "torch.rand(1, 3, 96, 96)",
    "maxvit_t": FIXED_224,
    "mvit_v1_b": "torch.rand(1, 3, 16, 224, 224)",
    "mvit_v2_s": "torch.rand(1, 3, 16, 224, 224)",
    "s3d": "torch.rand(1, 3, 16, 224, 224)",  # its last pooling window is 2x7x7
}
VIDEO = "torch.rand(1, 3, 4, 64, 64)"
DETECTION_IMAGE = "[torch.rand(3, 128, 128)]"
FLOW = "torch.rand(1, 3, 128, 128), torch.rand(1, 3, 128, 128)"

TORCHVISION_FILE = """\
import torch
import torchvision

torch.manual_seed(0)
model = torchvision.models.get_model({name!r}, weights=None{extra}).eval()
example_inputs = ({inputs},)
"""

# timm: convolutional networks take any size (small ones run faster); the others are given the input
# size of their pretrained configuration (position embeddings, windows and pooling are built for it).
TIMM_CNN_SIZES = {
    "resnet18": 96, "resnet50d": 96, "seresnext26d_32x4d": 96, "efficientnet_b0": 96, "mobilenetv3_small_100": 96,
    "mobilenetv4_conv_small": 96, "convnext_atto": 96, "convnextv2_atto": 96, "regnety_002": 96, "densenet121": 96,
    "dla34": 96, "ghostnet_100": 96, "rexnet_100": 96, "cspdarknet53": 96, "edgenext_xx_small": 96,
    "mobileone_s0": 96, "repvgg_a0": 96, "hrnet_w18_small": 96, "inception_v3": 96, "nf_resnet26": 96,
    "skresnet18": 96, "res2net50_26w_4s": 96, "ese_vovnet19b_dw": 96, "fastvit_t8": 96, "efficientvit_b0": 96,
    "dm_nfnet_f0": 96, "resnetv2_50": 96, "hgnetv2_b0": 96, "poolformer_s12": 96, "mobilevit_xxs": 96,
    "pvt_v2_b0": 96,
}
TIMM_FIXED = [
    "vit_tiny_patch16_224", "deit_tiny_distilled_patch16_224", "swin_tiny_patch4_window7_224",
    "swinv2_tiny_window8_256", "levit_128s", "mixer_s16_224", "resmlp_12_224", "efficientformer_l1",
    "crossvit_tiny_240", "cait_xxs24_224", "xcit_nano_12_p16_224", "maxvit_nano_rw_256", "coatnet_nano_rw_224",
    "davit_tiny", "focalnet_tiny_srf", "gcvit_xxtiny", "mvitv2_tiny", "hiera_tiny_224", "eva02_tiny_patch14_224",
    "sequencer2d_s", "tiny_vit_5m_224", "botnet26t_256", "halonet26t",
]
TIMM_MODELS = list(TIMM_CNN_SIZES) + TIMM_FIXED

TIMM_FILE = """\
import timm
import torch

torch.manual_seed(0)
model = timm.create_model({name!r}, pretrained=False, num_classes=100).eval()
size = {size}
example_inputs = (torch.rand(1, *size),)
"""

# transformers: small configurations of each family (2 layers, width 64, vocabulary 512), called with
# the keywords its users pass; ``ids``, ``mask`` and ``noise`` are defined in the model file.
TEXT = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=128)
DECODER = dict(TEXT, num_key_value_heads=2)
SEQ2SEQ = dict(vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128)
VISION = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=64,
              patch_size=8)
SPEECH = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
              conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
              num_conv_pos_embedding_groups=4)
ENCODER_CALL = '{"input_ids": ids(32), "attention_mask": mask(32)}'
DECODER_CALL = '{"input_ids": ids(32)}'
SEQ2SEQ_CALL = '{"input_ids": ids(32), "attention_mask": mask(32), "decoder_input_ids": ids(16)}'
PIXELS = '{"pixel_values": torch.rand(1, 3, 64, 64)}'
AUDIO = '{"input_values": noise(1, 4000)}'
# name: (model class, config class, config, call)
HF_MODELS: Dict[str, Tuple[str, str, Dict, str]] = {
    "bert": ("BertModel", "BertConfig", TEXT,
             '{"input_ids": ids(32), "attention_mask": mask(32), "token_type_ids": torch.zeros(2, 32, dtype=torch.long)}'),
    "roberta": ("RobertaForMaskedLM", "RobertaConfig", dict(TEXT, max_position_embeddings=130), ENCODER_CALL),
    "distilbert": ("DistilBertForSequenceClassification", "DistilBertConfig",
                   dict(vocab_size=512, dim=64, n_layers=2, n_heads=4, hidden_dim=128), ENCODER_CALL),
    "albert": ("AlbertModel", "AlbertConfig", dict(TEXT, embedding_size=32), ENCODER_CALL),
    "electra": ("ElectraForPreTraining", "ElectraConfig", dict(TEXT, embedding_size=32), ENCODER_CALL),
    "deberta": ("DebertaModel", "DebertaConfig", TEXT, ENCODER_CALL),
    "deberta_v2": ("DebertaV2Model", "DebertaV2Config", TEXT, ENCODER_CALL),
    "mpnet": ("MPNetModel", "MPNetConfig", TEXT, ENCODER_CALL),
    "xlnet": ("XLNetModel", "XLNetConfig", dict(vocab_size=512, d_model=64, n_layer=2, n_head=4, d_inner=128),
              ENCODER_CALL),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=128),
             DECODER_CALL),
    # attention scores in float32 with autocast switched off (transformers' maybe_autocast)
    "gpt2_upcast": ("GPT2LMHeadModel", "GPT2Config",
                    dict(n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=128,
                         reorder_and_upcast_attn=True, attn_implementation="eager"), DECODER_CALL),
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", TEXT, DECODER_CALL),
    "opt": ("OPTForCausalLM", "OPTConfig", dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, ffn_dim=128,
                                               num_attention_heads=4, word_embed_proj_dim=64), DECODER_CALL),
    "bloom": ("BloomForCausalLM", "BloomConfig", dict(vocab_size=512, hidden_size=64, n_layer=2, n_head=4),
              DECODER_CALL),
    "falcon": ("FalconForCausalLM", "FalconConfig", TEXT, DECODER_CALL),
    "llama": ("LlamaForCausalLM", "LlamaConfig", DECODER, DECODER_CALL),
    "mistral": ("MistralForCausalLM", "MistralConfig", DECODER, DECODER_CALL),
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", dict(DECODER, num_local_experts=4, num_experts_per_tok=2),
                DECODER_CALL),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", DECODER, DECODER_CALL),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(DECODER, head_dim=16), DECODER_CALL),
    # sliding-window layers (a window shorter than the input) and soft-capped logits, masked with torch.where
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", dict(DECODER, head_dim=16, sliding_window=16), DECODER_CALL),
    "phi": ("PhiForCausalLM", "PhiConfig", TEXT, DECODER_CALL),
    # its default pad, bos and eos ids (32000) lie beyond the small vocabulary
    "phi3": ("Phi3ForCausalLM", "Phi3Config", dict(DECODER, pad_token_id=0, bos_token_id=1, eos_token_id=2),
             DECODER_CALL),
    "mamba": ("MambaForCausalLM", "MambaConfig", dict(vocab_size=512, hidden_size=64, num_hidden_layers=2),
              DECODER_CALL),
    "t5": ("T5ForConditionalGeneration", "T5Config",
           dict(d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=512, d_kv=16), SEQ2SEQ_CALL),
    "bart": ("BartForConditionalGeneration", "BartConfig", SEQ2SEQ, SEQ2SEQ_CALL),
    "pegasus": ("PegasusForConditionalGeneration", "PegasusConfig", SEQ2SEQ, SEQ2SEQ_CALL),
    "whisper": ("WhisperForConditionalGeneration", "WhisperConfig",
                dict(SEQ2SEQ, num_mel_bins=80, max_source_positions=100, max_target_positions=64, pad_token_id=1,
                     bos_token_id=0, eos_token_id=2, decoder_start_token_id=0),
                '{"input_features": noise(1, 80, 200), "decoder_input_ids": ids(8, batch=1)}'),
    "wav2vec2": ("Wav2Vec2Model", "Wav2Vec2Config", SPEECH, AUDIO),
    "hubert": ("HubertModel", "HubertConfig", SPEECH, AUDIO),
    "vit": ("ViTForImageClassification", "ViTConfig", VISION, PIXELS),
    "deit": ("DeiTModel", "DeiTConfig", VISION, PIXELS),
    "dinov2": ("Dinov2Model", "Dinov2Config", dict(VISION, mlp_ratio=2), PIXELS),
    "swin": ("SwinModel", "SwinConfig", dict(image_size=64, patch_size=4, embed_dim=32, depths=[2, 2],
                                             num_heads=[2, 4], window_size=4), PIXELS),
    "clip": ("CLIPModel", "CLIPConfig",
             dict(text_config=dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=128, max_position_embeddings=64),
                  vision_config=dict(VISION), projection_dim=32),
             '{"input_ids": ids(16), "attention_mask": mask(16), "pixel_values": torch.rand(2, 3, 64, 64)}'),
    "convnext": ("ConvNextForImageClassification", "ConvNextConfig",
                 dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]), PIXELS),
    "resnet": ("ResNetForImageClassification", "ResNetConfig",
               dict(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]), PIXELS),
    "segformer": ("SegformerForSemanticSegmentation", "SegformerConfig",
                  dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], num_attention_heads=[1, 2, 4, 8],
                       decoder_hidden_size=64), PIXELS),
    "mobilevit": ("MobileViTForImageClassification", "MobileViTConfig", dict(image_size=64), PIXELS),
    "detr": ("DetrForObjectDetection", "DetrConfig",
             dict(use_timm_backbone=False, use_pretrained_backbone=False,
                  backbone_config=dict(model_type="resnet", embedding_size=16, hidden_sizes=[16, 32, 64, 128],
                                       depths=[1, 1, 1, 1], out_features=["stage4"]),
                  d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_queries=10),
             PIXELS),
}

# A subset that runs in minutes, for the probe on a GPU: each torchvision task (every detector kind),
# and the timm and transformers families with their own precision decisions or past failures.
REPRESENTATIVE = [
    "resnet50", "efficientnet_b0", "mobilenet_v3_large", "convnext_tiny", "vit_b_16", "swin_t", "inception_v3",
    "fasterrcnn_resnet50_fpn", "fasterrcnn_mobilenet_v3_large_fpn", "maskrcnn_resnet50_fpn",
    "keypointrcnn_resnet50_fpn", "retinanet_resnet50_fpn", "fcos_resnet50_fpn", "ssd300_vgg16",
    "ssdlite320_mobilenet_v3_large", "deeplabv3_resnet50", "fcn_resnet50", "lraspp_mobilenet_v3_large", "r3d_18",
    "s3d", "raft_small", "regnet_y_400mf",
    "timm/efficientnet_b0", "timm/levit_128s", "timm/vit_tiny_patch16_224", "timm/swin_tiny_patch4_window7_224",
    "timm/convnext_atto", "timm/mixer_s16_224",
    "hf/bert", "hf/gpt2", "hf/gpt2_upcast", "hf/llama", "hf/mixtral", "hf/t5", "hf/bart", "hf/whisper",
    "hf/wav2vec2", "hf/clip", "hf/detr", "hf/vit",
    # the families issue 26 tried as a new user would
    "resnext50_32x4d", "timm/eva02_tiny_patch14_224", "timm/fastvit_t8", "timm/efficientvit_b0",
    "timm/maxvit_nano_rw_256", "timm/nf_resnet26", "hf/qwen2", "hf/mistral", "hf/gemma2", "hf/phi3", "hf/mamba",
    "hf/dinov2", "hf/segformer",
]
# `--models issue26`: the families issue 26 tried that install here (its predicted-vs-measured target)
ISSUE_26 = [
    "resnext50_32x4d", "timm/eva02_tiny_patch14_224", "timm/fastvit_t8", "timm/efficientvit_b0",
    "timm/maxvit_nano_rw_256", "timm/nf_resnet26", "hf/qwen2", "hf/mistral", "hf/gemma2", "hf/phi3", "hf/mamba",
    "hf/dinov2", "hf/segformer", "fasterrcnn_resnet50_fpn", "hf/mixtral", "hf/wav2vec2", "hf/detr",
]

HF_FILE = """\
import torch
import transformers

torch.manual_seed(0)
model = transformers.{cls}(transformers.{config}(**{kwargs!r})).eval()


def ids(length, batch=2):
    return torch.randint(0, 512, (batch, length))


def mask(length, batch=2):
    m = torch.ones(batch, length, dtype=torch.long)
    m[-1, length // 2:] = 0  # the last sequence padded
    return m


def noise(*shape):
    return torch.randn(*shape)


def example_inputs():
    torch.manual_seed(1)
    return {call}
"""


def torchvision_family(name: str) -> str:
    import torchvision.models as tvm

    for fam, module in (("detection", tvm.detection), ("segmentation", tvm.segmentation), ("video", tvm.video),
                        ("optical_flow", tvm.optical_flow), ("quantized", tvm.quantization)):
        if name in tvm.list_models(module=module):
            return fam
    return "classification"


def torchvision_inputs(name: str, fam: str) -> str:
    if name in SPECIAL_INPUTS:
        return SPECIAL_INPUTS[name]
    if name.startswith("vit_"):
        return FIXED_224
    return {"detection": DETECTION_IMAGE, "video": VIDEO, "optical_flow": FLOW}.get(fam, IMAGE)


def hf_family(call: str, config: str) -> str:
    if "input_values" in call or "input_features" in call:
        return "speech"
    if "decoder_input_ids" in call:
        return "encoder-decoder"
    if "pixel_values" in call:
        return "vision" if "input_ids" not in call else "vision-text"
    return "decoder" if "CausalLM" in config else "encoder"


def model_file(name: str, detector_size: Optional[int]) -> Tuple[str, str, str]:
    """(suite, family, source of the model file) of a model named as --models takes it."""
    suite, _, short = name.rpartition("/")
    if suite == "timm":
        size = f"(3, {TIMM_CNN_SIZES[short]}, {TIMM_CNN_SIZES[short]})" if short in TIMM_CNN_SIZES else \
            'model.pretrained_cfg["input_size"]'
        return suite, "cnn" if short in TIMM_CNN_SIZES else "fixed-size", TIMM_FILE.format(name=short, size=size)
    if suite == "hf":
        cls, config, kwargs, call = HF_MODELS[short]
        return suite, hf_family(call, cls), HF_FILE.format(cls=cls, config=config, kwargs=kwargs, call=call)
    fam = torchvision_family(name)
    # detectors and segmenters would fetch ImageNet weights for their backbone by default
    extra = ", weights_backbone=None" if fam in ("detection", "segmentation") else ""
    if fam == "detection" and not name.startswith("ssd") and detector_size:
        # R-CNN, RetinaNet and FCOS resize every image to 800 pixels first; SSD's size is fixed
        extra += f", min_size={detector_size}, max_size={detector_size}"
    return "torchvision", fam, TORCHVISION_FILE.format(name=name, inputs=torchvision_inputs(name, fam), extra=extra)


def all_models(suites: List[str]) -> List[str]:
    names: List[str] = []
    if "torchvision" in suites:
        import torchvision

        names += torchvision.models.list_models()
    if "timm" in suites:
        names += [f"timm/{n}" for n in TIMM_MODELS]
    if "hf" in suites:
        names += [f"hf/{n}" for n in HF_MODELS]
    return names


def run(cmd: List[str], timeout: float, env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None) -> Dict:
    """Exit code (negative: the signal), wall seconds, peak RSS (MiB) and output of one command."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True, env=env, cwd=cwd)
        rc, usage, timed_out = None, None, False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.perf_counter() - start > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                _, status, usage = os.wait4(proc.pid, 0)
                timed_out = True
                break
            time.sleep(0.2)
        proc.returncode = rc if rc is not None else -9  # reaped here: Popen must not wait for it again
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    return {"rc": rc, "timed_out": timed_out, "wall_s": round(wall, 1),
            "rss_mib": round(usage.ru_maxrss / 1024) if usage is not None else None,
            "stdout": stdout, "stderr": stderr}


def outcome(result: Dict, cut: bool = False) -> Dict:
    """What a run tells: ok or the class of its failure, with its last line; what the report holds."""
    entry = {k: result[k] for k in ("rc", "wall_s", "rss_mib")}
    report = None
    if result["rc"] in (0, 1):
        try:
            report = json.loads(result["stdout"])
        except ValueError:
            report = None
    if result["timed_out"]:
        entry["status"] = "cut" if cut else "timeout"  # cut: ended by the run's time budget, not a hang
    elif result["rc"] is not None and result["rc"] < 0:
        entry["status"] = f"signal {-result['rc']}"
    elif report is not None:
        entry["status"] = "ok"
    elif "internal error" in result["stderr"] or "Traceback" in result["stderr"]:
        entry["status"] = "traceback"
    elif result["rc"] == 2:
        entry["status"] = "refused"  # one line that says why: preclint's answer, not a crash
    else:
        entry["status"] = "failed"
    if entry["status"] != "ok":
        lines = [line for line in result["stderr"].strip().splitlines() if line.strip()]
        entry["error"] = lines[-1][:300] if lines else ""
    if report is not None:
        entry.update(report_figures(report))
        accuracy = report_accuracy(report)
        if accuracy:
            entry["accuracy"] = accuracy
    return settle(entry)


def settle(entry: Dict) -> Dict:
    """A run that printed its report but could not measure a precision: the model's own failure (or
    memory) is a degraded result, any other exception preclint's internal error."""
    unmeasured = entry.get("modes_not_measured")
    if entry.get("status") == "ok" and unmeasured:
        own = all(error.startswith(("the model failed", "out of memory")) for error in unmeasured.values())
        entry["status"] = "partial" if own else "internal error"
        entry["error"] = "; ".join(f"{mode}: {error}" for mode, error in unmeasured.items())[:300]
    return entry


def report_figures(report: Dict) -> Dict:
    entry: Dict = {"capture": report.get("capture")}
    codes: Dict[str, int] = {}
    statuses: Dict[str, int] = {}
    refuted: Dict[str, int] = {}
    for f in report.get("findings", []):
        codes[f["code"]] = codes.get(f["code"], 0) + 1
        if f["code"] != PROBE_ONLY:
            status = f.get("status") or "unmeasured"
            statuses[status] = statuses.get(status, 0) + 1
            if status == "refuted":
                refuted[f["code"]] = refuted.get(f["code"], 0) + 1
    entry["findings"] = dict(sorted(codes.items()))
    entry["static"] = dict(sorted(statuses.items()))
    misplaced = misplaced_findings(report)
    if misplaced:
        entry["misplaced"] = misplaced
    if refuted:
        entry["refuted"] = dict(sorted(refuted.items()))
    notes = [n for n in report.get("notes", []) if any(
        words in n for words in ("could not", "not measured", "without", "left the reference's path", "cannot run"))]
    if notes:
        entry["notes"] = [n[:200] for n in notes]
    if report.get("caveats"):  # the weights a poor stand-in, outputs degenerate: said once per model
        entry["caveats"] = [c[:200] for c in report["caveats"]]
    # probe/mismatch.py: measured and predicted more than 3x apart, for the outputs together or for one
    mismatches = [n for n in report.get("notes", []) if n.startswith("probe: ") and " predicted (" in n]
    if mismatches:
        entry["mismatch_notes"] = [n[:300] for n in mismatches]
    summary = report.get("summary", {})
    unmeasured = {mode: s["measured_output"]["error"] for mode, s in summary.items()
                  if "error" in s.get("measured_output", {})}
    if unmeasured:
        entry["modes_not_measured"] = unmeasured
    detections = {mode: {k: v for k, v in s["measured_output"]["detections"].items()
                         if k in ("reference", "kept", "moved", "relabelled", "lost", "added", "flip_fraction")}
                  for mode, s in summary.items() if "detections" in s.get("measured_output", {})}
    if detections:
        entry["detections"] = detections
    return entry


def misplaced_findings(report: Dict) -> int:
    """Findings located outside the model's file and the libraries that hold its layers: in
    preclint's own files, the launcher that started it, Python's runpy (issue 26)."""
    model_file = (report.get("model") or "").rsplit(":", 1)[0]
    count = 0
    for f in report.get("findings", []):
        location = f.get("location") or {}
        path = location.get("path")
        if path and path != model_file and (not location.get("library") or path.startswith("preclint/")):
            count += 1
    return count


class Budget:
    """The run's wall-clock budget: a command gets what is left of it, at most its own timeout."""

    def __init__(self, seconds: Optional[float]):
        self.deadline = time.perf_counter() + seconds if seconds else None

    def left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.perf_counter()


MIN_COMMAND_S = 5.0  # a command is not started with less time left than this


def cover(name: str, directory: str, timeout: float, probes: List[str], budget: Budget,
          env: Optional[Dict[str, str]] = None, detector_size: Optional[int] = 128) -> Optional[Dict]:
    """Check then probe one model; None when the budget ran out before it started."""
    if budget.left() < MIN_COMMAND_S:
        return None
    entry: Dict = {"model": name}
    try:
        suite, fam, source = model_file(name, detector_size)
    except KeyError:
        return {"model": name, "suite": name.rpartition("/")[0] or "torchvision", "family": "?",
                "check": {"status": "unknown model", "rc": None, "wall_s": 0, "rss_mib": None}}
    entry.update(suite=suite, family=fam)
    path = os.path.join(directory, name.replace("/", "__") + ".py")
    with open(path, "w") as f:
        f.write(source)
    base = [sys.executable, "-m", "preclint", "check", path, "--output-format", "json", "--exit-zero"]
    for key, cmd in [("check", base)] + [(f"probe_{device}", base + ["--probe", device]) for device in probes]:
        left = budget.left()
        if left < MIN_COMMAND_S:
            entry[key] = {"status": "not reached", "rc": None, "wall_s": 0, "rss_mib": None}
            continue
        limit = min(timeout, left)
        entry[key] = outcome(run(cmd, limit, env, cwd=directory), cut=limit < timeout)
        if entry["check"]["status"] != "ok":
            break  # nothing to probe
    return entry


CRASHES = ("signal", "traceback", "timeout", "failed", "internal")


def crashed(status: Optional[str]) -> bool:
    return status is not None and status.split()[0] in CRASHES


def summarize(entries: List[Dict], probes: List[str]) -> Dict:
    """Per suite: models, how captured, check ok, each probe ok, failures by class, static findings
    and the share the probe refuted."""
    suites: Dict[str, Dict] = {}
    for suite in sorted({e.get("suite", "torchvision") for e in entries}):
        group = [e for e in entries if e.get("suite", "torchvision") == suite]
        suites[suite] = summarize_group(group, probes)
    return {"suites": suites, "all": summarize_group(entries, probes)}


def summarize_group(entries: List[Dict], probes: List[str]) -> Dict:
    keys = ["check"] + [f"probe_{d}" for d in probes]

    def count(key, status="ok"):
        return sum(1 for e in entries if e.get(key, {}).get("status") == status)

    for e in entries:
        for key in keys:
            if key in e:
                settle(e[key])

    captures: Dict[str, int] = {}
    failures: Dict[str, int] = {}
    static: Dict[str, int] = {}
    for e in entries:
        c = e["check"].get("capture")
        if c:
            captures[c] = captures.get(c, 0) + 1
        for key in keys:
            status = e.get(key, {}).get("status")
            if status and status != "ok":
                failures[f"{key}: {status}"] = failures.get(f"{key}: {status}", 0) + 1
        for key in keys[1:]:
            for status, n in e.get(key, {}).get("static", {}).items():
                static[status] = static.get(status, 0) + n
    measured = [e for e in entries if e["check"].get("status") not in ("cut", "not reached", "unknown model")]
    no_crash = sum(1 for e in measured if not any(crashed(e.get(k, {}).get("status")) for k in keys))
    all_ok = sum(1 for e in measured if all(e.get(k, {}).get("status") == "ok" for k in keys))
    walls = sorted(e[k]["wall_s"] for e in entries for k in keys if e.get(k, {}).get("status") == "ok")
    total_static = sum(static.values())
    return {
        "models": len(entries),
        "measured": len(measured),
        "captured": captures,
        "check_ok": count("check"),
        **{f"{k}_ok": count(k) for k in keys[1:]},
        **{f"{k}_run": sum(1 for e in entries if k in e and e[k]["status"] not in ("not reached", "cut"))
           for k in keys[1:]},
        "all_ok": all_ok,
        "no_crash": no_crash,
        "failures": dict(sorted(failures.items())),
        "misplaced_findings": sum(e.get(k, {}).get("misplaced", 0) for e in entries for k in keys),
        "static_findings": dict(sorted(static.items())),
        "refuted_pct": round(100.0 * static.get("refuted", 0) / total_static, 2) if total_static else None,
        "ok_wall_s": {"median": walls[len(walls) // 2] if walls else None, "max": walls[-1] if walls else None,
                      "total": round(sum(walls), 1)},
        "max_rss_mib": max([(e[k].get("rss_mib") or 0) for e in entries for k in keys if k in e] or [0]),
        # issue 26: predicted within 3x of measured, per (model, precision) pair, for each probe
        **{f"{k}_accuracy": summarize_accuracy(entries, k) for k in keys[1:]},
    }


def load(path: str) -> Dict:
    """A result file, its summary computed again from its models (as this script now classifies them)."""
    with open(path) as f:
        data = json.load(f)
    data["summary"] = summarize(data["models"], data.get("probes", []))
    return data


def pct(n: int, d: int) -> str:
    return f"{n}/{d} ({100.0 * n / d:.0f}%)" if d else "-"


def markdown(paths: List[str]) -> str:
    """The README's coverage table: one row per suite of each result file."""
    lines = ["| run | suite | models | checked ok | probed ok | no crash | captured fx / function-mode | "
             "static findings (refuted) | median / max s | peak RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for path in paths:
        data = load(path)
        probes = data.get("probes", [])
        for suite, s in list(data["summary"]["suites"].items()) + [("all", data["summary"]["all"])]:
            probed = "; ".join(f"{p}: {pct(s[f'probe_{p}_ok'], s[f'probe_{p}_run'])}" for p in probes) or "not run"
            static = s["static_findings"]
            total = sum(static.values())
            refuted = f"{total} ({static.get('refuted', 0)}, {s['refuted_pct']}%)" if total else "0"
            lines.append(
                f"| {os.path.basename(path)} | {suite} | {s['models']} | {pct(s['check_ok'], s['measured'])} | "
                f"{probed} | {pct(s['no_crash'], s['measured'])} | {s['captured'].get('fx', 0)} / "
                f"{s['captured'].get('function-mode', 0)} | {refuted} | {s['ok_wall_s']['median']} / "
                f"{s['ok_wall_s']['max']} | {s['max_rss_mib']} |")
    return "\n".join(lines)


def compare(paths: List[str]) -> str:
    """Result files side by side (e.g. before and after a change), then every model that is not ok
    in the last of them."""
    runs = [load(path) for path in paths]
    keys = sorted({k for r in runs for k in r["summary"]["all"] if k.endswith("_ok") or k.endswith("_run")})
    rows = [("models", lambda s: s["models"]),
            ("captured by fx / function-mode",
             lambda s: f"{s['captured'].get('fx', 0)} / {s['captured'].get('function-mode', 0)}")]
    rows += [(k, lambda s, k=k: s.get(k, "-")) for k in keys]
    rows += [("no crash", lambda s: s["no_crash"]),
             ("failures", lambda s: ", ".join(f"{k} {v}" for k, v in s["failures"].items()) or "none"),
             ("static findings", lambda s: s["static_findings"]),
             ("refuted %", lambda s: s["refuted_pct"]),
             ("ok wall s: median / max / total", lambda s: "{median} / {max} / {total}".format(**s["ok_wall_s"])),
             ("largest peak RSS (MiB)", lambda s: s["max_rss_mib"])]
    lines = ["| | " + " | ".join(os.path.basename(p) for p in paths) + " |", "|---" * (len(paths) + 1) + "|"]
    for label, value in rows:
        lines.append(f"| {label} | " + " | ".join(str(value(r["summary"]["all"])) for r in runs) + " |")
    for e in runs[-1]["models"]:
        for key in [k for k in e if k == "check" or k.startswith("probe_")]:
            if e[key].get("status") != "ok":
                lines.append(f"- {e['model']}: {key} {e[key]['status']}: {e[key].get('error', '')}")
    if runs[-1].get("not_reached"):
        lines.append(f"- not reached in the time budget: {', '.join(runs[-1]['not_reached'])}")
    return "\n".join(lines)


def machine() -> Dict:
    import torch
    import torchvision

    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "torchvision": torchvision.__version__, "cpu": platform.machine(), "cores": os.cpu_count()}
    for package in ("timm", "transformers"):
        try:
            versions[package] = __import__(package).__version__
        except ImportError:
            versions[package] = None
    if torch.cuda.is_available():
        versions["gpu"] = torch.cuda.get_device_name(0)
    return versions


def line(entry: Dict) -> str:
    check = entry["check"]
    parts = [f"{entry['model']:40s} {check.get('capture') or '-':14s} check {check['status']:9s} "
             f"{check['wall_s']:6.1f}s {check['rss_mib'] or 0:6d}MiB"]
    error = check.get("error")
    for key in [k for k in entry if k.startswith("probe_")]:
        probe = entry[key]
        parts.append(f"{key} {probe['status']:9s} {probe['wall_s']:6.1f}s {probe['rss_mib'] or 0:6d}MiB")
        error = error or probe.get("error")
    return "  ".join(parts) + (f"  {error}" if error else "")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default=",".join(SUITES), help=f"comma-separated, of {', '.join(SUITES)} (default all)")
    parser.add_argument("--models", help="comma-separated names: torchvision's, timm/NAME, hf/NAME (default: the "
                        "suites' lists); 'representative': a subset of every task and family, for the GPU; 'issue26': the "
                        "families issue 26 tried")
    parser.add_argument("--skip", help="comma-separated names to leave out")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per command (default 600)")
    parser.add_argument("--time-budget", type=float, help="seconds for the whole run: no command starts after it, "
                        "one still running is ended (recorded as cut), the rest are listed as not reached")
    parser.add_argument("--no-probe", action="store_true", help="check only")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="cuda: probe on the GPU as well as emulated on the CPU (default cpu)")
    parser.add_argument("--probe", help="comma-separated probe devices, instead of --device's (e.g. cuda alone)")
    parser.add_argument("--detector-size", type=int, default=128,
                        help="min_size and max_size of R-CNN, RetinaNet and FCOS detectors (0: their default, 800)")
    parser.add_argument("--jobs", type=int, default=1, help="models checked at once, each in its own process")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS of each command (default: cores / jobs)")
    parser.add_argument("--out", help="write the results as JSON here, or into this folder if it is one "
                        "(rewritten after every model)")
    parser.add_argument("--resume", action="store_true", help="keep the models --out already holds, run the rest")
    parser.add_argument("--retry", action="store_true", help="with --resume, run again the models that were not ok")
    parser.add_argument("--compare", nargs="+", metavar="FILE", help="print result files side by side and exit")
    parser.add_argument("--markdown", nargs="+", metavar="FILE", help="print the README's coverage table and exit")
    args = parser.parse_args(argv)
    if args.compare:
        print(compare(args.compare))
        return 0
    if args.markdown:
        print(markdown(args.markdown))
        return 0
    budget = Budget(args.time_budget)
    probes = [] if args.no_probe else (args.probe.split(",") if args.probe else
                                       ["cpu"] + (["cuda"] if args.device == "cuda" else []))
    env = dict(os.environ)
    # the children check with the preclint beside this script, installed or not
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = str(args.threads or max(1, (os.cpu_count() or 1) // args.jobs))
    out = args.out
    if out and os.path.isdir(out):
        out = os.path.join(out, "coverage.json")

    suites = args.suites.split(",")
    if args.models == "representative":
        names = REPRESENTATIVE
    elif args.models == "issue26":
        names = ISSUE_26
    else:
        names = args.models.split(",") if args.models else all_models(suites)
    skip = set(args.skip.split(",")) if args.skip else set()
    names = [n for n in names if n not in skip]
    entries: List[Dict] = []
    earlier_runs: List[Dict] = []
    if args.resume and out and os.path.exists(out):
        with open(out) as f:
            again = ("cut", "not reached") if not args.retry else None
            kept = json.load(f)
            earlier_runs = kept.get("earlier_runs", []) + ([kept["provenance"]] if "provenance" in kept else [])
            entries = [e for e in kept["models"] if e["model"] not in names
                       or all(e[k]["status"] not in again if again else settle(e[k])["status"] == "ok"
                              for k in e if k == "check" or k.startswith("probe_"))]
    done = {e["model"] for e in entries}
    todo = [n for n in names if n not in done]
    info = machine()
    lock = threading.Lock()

    def save(not_reached: List[str]) -> None:
        if not out:
            return
        order = {n: i for i, n in enumerate(names)}
        entries.sort(key=lambda e: order.get(e["model"], len(order)))
        with open(out + ".tmp", "w") as f:
            json.dump(stamp({"machine": info, "jobs": args.jobs, "threads": env["OMP_NUM_THREADS"], "probes": probes,
                             "detector_size": args.detector_size, "time_budget_s": args.time_budget,
                             **({"earlier_runs": earlier_runs} if earlier_runs else {}),
                             "summary": summarize(entries, probes), "not_reached": not_reached, "models": entries}),
                      f, indent=1)
            f.write("\n")
        os.replace(out + ".tmp", out)

    not_reached: List[str] = []
    with tempfile.TemporaryDirectory() as directory, \
            concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(cover, name, directory, args.timeout, probes, budget, env, args.detector_size): name
                   for name in todo}
        for future in concurrent.futures.as_completed(futures):
            entry = future.result()
            with lock:
                if entry is None:
                    not_reached.append(futures[future])
                    continue
                entries.append(entry)
                print(line(entry), flush=True)
                save(sorted(not_reached))
    save(sorted(not_reached, key=names.index))
    summary = summarize(entries, probes)
    print(json.dumps(summary["all"], indent=1))
    if not_reached:
        print(f"not reached in the time budget: {len(not_reached)} models", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
