"""What MODEL names and what its files say, before any weights load (torch-free).

Lives here: ``resolve.py`` (MODEL -> ``Source``: hub id, folder, GGUF, trainer checkpoint),
``model_config.py`` (a model's config.json read once: context, layers, vocabulary, phantom),
``size.py`` (the memory a config asks for), ``devices.py`` (``--device``, ``--dtype``,
``--device-map``), ``checkpoint_folder.py`` (a trainer checkpoint on disk and its config.json),
``trainer_config.py`` (the trainer's variants, tiers and ``GPTConfig``), ``trained_context.py``
(a model's trained context), ``bridge.py`` (TransformerLens's bridge unwrapped).
May import: data, store, runtime, errors; never run (where models load), train or anything above.
Add here: a new kind of MODEL to resolve, or a new question a config file answers.
"""
