"""``--loader transformer-lens``: the model as a TransformerLens user studies it, a ``HookedTransformer`` (issue 57).

sinkscope loads the weights as it always does (hub cache, folder, GGUF: ``run/loaders.load_model``),
then TransformerLens 3 builds the ``HookedTransformer`` from them with its own functions, the path its
``from_pretrained`` takes for a local folder: ``convert_hf_model_config`` on the model's config,
``get_pretrained_state_dict`` on the loaded model, and ``load_and_process_state_dict`` with the
processing options given by ``--loader-option`` (TransformerLens's defaults otherwise: ``fold_ln``,
``center_writing_weights``, ``center_unembed`` and ``fold_value_biases`` on). The model is then
measured through its own hooks (``capture/hooked.py``). The manifest records the loader and its
options (``options.loader``, ``options.loader_option``) and TransformerLens's version.

An architecture TransformerLens converts only from its official hub names (Gemma), a trainer
checkpoint and TransformerLens 4 (which removed ``HookedTransformer``) are one sentence each.
"""

from __future__ import annotations

import copy
import tempfile

from sinkscope.capture.hooked import HookedModel, processing_options
from sinkscope.errors import SinkscopeError, option
from sinkscope.models.resolve import Source
from sinkscope.run.loaders import LoadedModel, load_model

def _transformer_lens():
    try:
        import transformer_lens.loading_from_pretrained as loading
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError:
        raise SinkscopeError(f"{option('loader')} transformer-lens needs TransformerLens 3's HookedTransformer, which "
                             "TransformerLens 4 removed; install it with pip install 'transformer-lens>=3,<4', or "
                             f"measure the model without {option('loader')} (a TransformerBridge is measured as it "
                             "is).") from None
    return loading, HookedTransformer, HookedTransformerConfig


def load_hooked(source: Source, *, device: str, dtype: str, loader_option, trust_remote_code: bool, tokenizer,
                log) -> LoadedModel:
    """The model of ``source`` as TransformerLens 3 builds it (module docstring), wrapped for measuring."""
    if source.kind == "checkpoint":
        raise SinkscopeError(f"{option('loader')} transformer-lens reads Hugging Face models; a sinkscope trainer "
                             "checkpoint is measured as it is.")
    processing = processing_options(loader_option)
    loading, HookedTransformer, HookedTransformerConfig = _transformer_lens()
    loaded = load_model(source, device=device, dtype=dtype, trust_remote_code=trust_remote_code, tokenizer=tokenizer,
                        log=log)
    model = loaded.model
    config = copy.deepcopy(model.config)
    if getattr(config, "model_type", None) == "gpt2" and not hasattr(config, "n_ctx"):
        config.n_ctx = config.n_positions  # TransformerLens 3 reads GPT-2's context under its old name
    log(f"Building a HookedTransformer with TransformerLens ({', '.join(f'{k}={v}' for k, v in processing.items())}) ...")
    with tempfile.TemporaryDirectory(prefix="sinkscope-tl-") as folder:
        config.save_pretrained(folder)
        try:
            fields = loading.convert_hf_model_config(folder)
        except (NotImplementedError, ValueError, KeyError) as error:
            raise SinkscopeError(f"TransformerLens cannot convert this {getattr(config, 'model_type', 'model')} from its "
                                 f"config ({str(error).splitlines()[0][:160]}); measure it without "
                                 f"{option('loader')}.") from None
        fields.update(model_name=source.label or source.location, init_weights=False, device=str(loaded.device),
                      dtype=loaded.dtype, tokenizer_name=None)
        cfg = HookedTransformerConfig(**fields)
        state = loading.get_pretrained_state_dict(folder, cfg, hf_model=model)
    hooked = HookedTransformer(cfg)
    hooked.load_and_process_state_dict(state, **processing)
    hooked.eval()
    del model, state
    return LoadedModel(HookedModel(hooked), loaded.tokenizer, source, loaded.dtype, loaded.device, loaded.cache_path)
