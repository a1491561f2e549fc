"""The lab commands: ``train`` (the bundled trainer), ``sweep``, ``toy`` and ``run`` (recipes)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from sinkscope.cli.application import _friendly_errors, _interrupted, app
from sinkscope.cli.options import (DATA_PANEL, EXECUTOR_PANEL, MODEL_PANEL, OUTPUT_PANEL, DatasetOpt, DeviceOpt, OverwriteOpt,
                                   PanelledCommand, ProgressOpt, TextFileOpt, executor_params)


@app.command(cls=PanelledCommand)
@_friendly_errors
def train(
    variant: Annotated[Optional[str], typer.Option("--variant", help="baseline | offbyone | sinklogit | sinktoken | normgate | projgate | sink+norm | sink+proj | routing-norm | outgate [default: baseline].")] = None,
    task: Annotated[Optional[str], typer.Option("--task", help="text (the corpus) | trigger (SPEC.md's trigger-conditional task, generated) [default: text].")] = None,
    tier: Annotated[Optional[str], typer.Option("--tier", help="micro (~1 min on CPU) | tiny (~4 min on 2 idle cores) | 10M | 50M | 124M | 350M [default: micro for --task trigger, tiny for text].")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Initialisation and batch order (shared across variants) [default: 0].")] = None,
    out: Annotated[str, typer.Option("--out", "-o", help="Checkpoint folder.", rich_help_panel=OUTPUT_PANEL)] = "ckpt",
    steps: Annotated[Optional[int], typer.Option("--steps", help="Optimizer steps (the cosine schedule's length) [default: the tier's; 600 for tiny, 1000 for micro].")] = None,
    batch_size: Annotated[Optional[int], typer.Option("--batch-size", help="Sequences per optimizer step, over all processes and --grad-accum micro-batches: a training hyperparameter (the measuring commands' --batch-size is windows per forward pass) [default: the tier's].")] = None,
    lr: Annotated[Optional[float], typer.Option("--lr", help="Peak learning rate.")] = None,
    min_lr: Annotated[Optional[float], typer.Option("--min-lr", help="Floor of the cosine (default lr/10).")] = None,
    warmup_steps: Annotated[Optional[int], typer.Option("--warmup-steps", help="Linear warmup steps (tier default).")] = None,
    grad_accum: Annotated[Optional[int], typer.Option("--grad-accum", help="Micro-batches per step (batches unchanged).")] = None,
    eval_every: Annotated[Optional[int], typer.Option("--eval-every", help="Validation loss every N steps.", rich_help_panel=OUTPUT_PANEL)] = None,
    checkpoint_every: Annotated[Optional[int], typer.Option("--checkpoint-every", help="Checkpoint every N steps.", rich_help_panel=OUTPUT_PANEL)] = None,
    stop_at: Annotated[Optional[int], typer.Option("--stop-at", help="Stop (checkpointed) after this step; continue with --resume.", rich_help_panel=OUTPUT_PANEL)] = None,
    monitor_every: Annotated[Optional[int], typer.Option("--monitor-every", help="Sink probes (p0 mass, phantom mass, value-norm ratio) every N steps on 8 fixed validation windows, into monitor.csv; `sinkscope report CKPT` draws them against the step.", rich_help_panel=OUTPUT_PANEL)] = None,
    text_file: TextFileOpt = None,
    dataset: DatasetOpt = None,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="bpe4096 (default, trained on the corpus) | gpt2 | a tokenizer folder.", rich_help_panel=DATA_PANEL)] = None,
    windows: Annotated[Optional[str], typer.Option("--windows", help="Text windows: doc-start (default: BOS, then a paragraph start) | random (any offset, no BOS).", rich_help_panel=DATA_PANEL)] = None,
    task_set: Annotated[Optional[list[str]], typer.Option("--task-set", help="A task option key=value (repeatable); trigger: vocab=64, trigger_rate=0.12, length=0 (= block_size), task_seed=0.", rich_help_panel=DATA_PANEL)] = None,
    tnlm: Annotated[bool, typer.Option("--tnlm", help="TNLM loss: no cross-entropy term at position 0 (the P0-sink study).")] = False,
    lb_lambda: Annotated[float, typer.Option("--lb-lambda", help="Sink-aware load-balancing loss weight (Fu et al. 2026; 1e-4 there).")] = 0.0,
    force_sink_k: Annotated[Optional[int], typer.Option("--force-sink-k", help="Force-sink masking with k channels (the P0-sink study; 16 there).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a model field: key=value (repeatable), e.g. n_layer=2.", rich_help_panel=MODEL_PANEL)] = None,
    device: DeviceOpt = "auto",
    resume: Annotated[bool, typer.Option("--resume", help="Continue the checkpoint in --out.", rich_help_panel=OUTPUT_PANEL)] = False,
    overwrite: OverwriteOpt = False,
    progress: ProgressOpt = True,
    trust_remote_code: Annotated[bool, typer.Option("--trust-remote-code", help="Allow code in the --tokenizer folder to run (never a checkpoint's own tokenizer's).", rich_help_panel=DATA_PANEL)] = False,
) -> None:
    """Train a small GPT-2-style model with one of the attention variants of SPEC.md.

    The checkpoint folder is a MODEL for every probe command (e.g. `sinkscope sinks ckpt/`).

    Examples:

    \b
        sinkscope train --variant sink+proj --tier tiny --seed 0 --out ckpt/sink-proj

    \b
        sinkscope train --variant baseline --tier tiny --set n_layer=2 --steps 100 --out ckpt/quick

    \b
        sinkscope train --task trigger --variant sinklogit --seed 1 --out ckpt/trigger-sinklogit

    \b
        sinkscope train --variant sinklogit --set layer_pattern=sliding,full --set window=32 --out ckpt/gptoss-like

    \b
        torchrun --nproc-per-node 8 -m sinkscope train --variant sinklogit --tier 124M --device cuda --out ckpt/124m  # needs: GPU
    """
    from sinkscope.train.loop import train as train_model
    from sinkscope.train.config import TrainOptions

    options = TrainOptions(
        variant=variant, task=task, windows=windows, task_options=list(task_set or []), tier=tier, seed=seed, out=out, steps=steps, batch_size=batch_size, lr=lr,
        min_lr=min_lr, warmup_steps=warmup_steps, grad_accum=grad_accum, eval_every=eval_every,
        checkpoint_every=checkpoint_every, stop_at=stop_at, monitor_every=monitor_every, text_file=text_file, dataset=dataset, tokenizer=tokenizer, tnlm=tnlm, lb_lambda=lb_lambda,
        force_sink_k=force_sink_k, overrides=list(set_ or []), device=device, resume=resume,
        overwrite=overwrite, progress=progress, trust_remote_code=trust_remote_code,
    )
    try:
        folder = train_model(options)
    except KeyboardInterrupt as stop:  # what --out keeps, and the command that continues from there
        word, code = _interrupted()
        advice = getattr(stop, "advice", f"{out} keeps its last checkpoint, if one was written (continue with --resume)")
        typer.echo(f"error: {word}; {advice}.", err=True)
        raise typer.Exit(code) from None
    if folder is not None:
        typer.echo(str(folder))


@app.command(cls=PanelledCommand)
@_friendly_errors
@executor_params(skip=("jobs",))
def sweep(
    variants: Annotated[str, typer.Option("--variants", help="Comma-separated trainer variants.")] = "baseline,sinklogit,normgate,projgate,sink+norm,sink+proj",
    seeds: Annotated[str, typer.Option("--seeds", help="Comma-separated seeds (shared across variants: paired).")] = "0,1,2",
    task: Annotated[str, typer.Option("--task", help="trigger | text.")] = "trigger",
    tier: Annotated[Optional[str], typer.Option("--tier", help="A trainer tier [default: micro for trigger, tiny for text].")] = None,
    out: Annotated[str, typer.Option("--out", "-o", help="The sweep folder (runs, tables, report); rerun to resume.", rich_help_panel=OUTPUT_PANEL)] = "sweeps/sweep",
    steps: Annotated[Optional[int], typer.Option("--steps", help="Optimizer steps per run [default: the tier's].")] = None,
    batch_size: Annotated[Optional[int], typer.Option("--batch-size", help="Sequences per optimizer step of every run, as for train [default: the tier's].")] = None,
    eval_windows: Annotated[int, typer.Option("--eval-windows", help="Fixed validation windows whose loss the tables compare.")] = 64,
    task_set: Annotated[Optional[list[str]], typer.Option("--task-set", help="A task option key=value (repeatable), as for train.", rich_help_panel=DATA_PANEL)] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="A model field key=value for every run (repeatable), as for train.", rich_help_panel=MODEL_PANEL)] = None,
    text_file: TextFileOpt = None,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="--task text: as for train [default: bpe4096].", rich_help_panel=DATA_PANEL)] = None,
    windows: Annotated[Optional[str], typer.Option("--windows", help="--task text: doc-start (default) | random.", rich_help_panel=DATA_PANEL)] = None,
    n_seqs: Annotated[int, typer.Option("--n-seqs", help="Validation windows the sinks/selectivity probes measure.", rich_help_panel=DATA_PANEL)] = 64,
    probe: Annotated[bool, typer.Option("--probe/--no-probe", help="Run sinks (and selectivity on gated variants) on every checkpoint.")] = True,
    monitor_every: Annotated[Optional[int], typer.Option("--monitor-every", help="The trainer's sink monitor every N steps in every run; the sweep draws p0 mass, phantom mass and value-norm ratio against the step, one line per variant (formation_*.png).", rich_help_panel=OUTPUT_PANEL)] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Runs at once, as local processes.", rich_help_panel=EXECUTOR_PANEL)] = 1,
    launcher: Annotated[str, typer.Option("--launcher", help="local | submitit: the same as --executor slurm (kept for old scripts).", rich_help_panel=EXECUTOR_PANEL)] = "local",
    slurm: Annotated[Optional[list[str]], typer.Option("--slurm", help="--executor slurm: any other submitit parameter key=value (repeatable), e.g. slurm_mem=64G.", rich_help_panel=EXECUTOR_PANEL)] = None,
    device: DeviceOpt = "auto",
    **executor_options,
) -> None:
    """Train every variant for every seed, probe each checkpoint, write Wang 2026's Tables 1 and 2.

    Finished runs are skipped and interrupted ones resumed, so rerunning the command continues it.
    --out is a new folder or this sweep's own: a folder holding files sinkscope did not write is refused.

    Examples:

    \b
        sinkscope sweep --variants baseline,sinklogit,normgate,projgate,sink+norm,sink+proj --seeds 0,1,2 --task trigger --out sweeps/trigger

    \b
        sinkscope sweep --variants baseline,sinklogit --seeds 0,1 --steps 200 --jobs 2 --out sweeps/quick

    \b
        sinkscope sweep --task text --tier tiny --seeds 0,1,2 --executor slurm --slurm-partition gpu --slurm-gpus-per-run 1 --out sweeps/text  # needs: SLURM

    \b
        sinkscope sweep --tier 124M --seeds 0,1,2,3,4 --executor ray --ray-address auto --out sweeps/124m  # needs: Ray cluster
    """
    from sinkscope.executors.settings import choose_executor
    from sinkscope.lab.sweep import SweepOptions, parse_list, sweep as run_sweep

    executor_options = choose_executor({**executor_options, "jobs": jobs, "slurm_extra": tuple(slurm or ())}
                            | ({"executor": "slurm"} if launcher == "submitit" else {}))

    options = SweepOptions(
        variants=parse_list(variants, "variants"), seeds=parse_list(seeds, "seeds", int), task=task, tier=tier,
        out=out, steps=steps, batch_size=batch_size, eval_windows=eval_windows, task_options=list(task_set or []),
        overrides=list(set_ or []), text_file=text_file, tokenizer=tokenizer, windows=windows,
        n_seqs=n_seqs, probe=probe, monitor_every=monitor_every, jobs=jobs, launcher=launcher,
        slurm=list(slurm or []), device=device,
    )
    try:
        page = run_sweep(options, log=lambda message: typer.echo(message, err=True), executor_options=executor_options)
    except KeyboardInterrupt:
        word, code = _interrupted()
        typer.echo(f"error: {word}; rerun the same command to continue the sweep in {out}.", err=True)
        raise typer.Exit(code) from None
    typer.echo(str(page))


@app.command(cls=PanelledCommand)
@_friendly_errors
@executor_params(skip=("jobs",))
def toy(
    loads: Annotated[str, typer.Option("--loads", help="Comma-separated loads N/64 (features per dimension).")] = "1,2,4,8",
    conditions: Annotated[str, typer.Option("--conditions", help="blind (channel-blind keys) and/or visible (routing-visible keys).")] = "blind,visible",
    variants: Annotated[str, typer.Option("--variants", help="baseline, offbyone, normgate, oracle.")] = "baseline,offbyone,normgate,oracle",
    seeds: Annotated[str, typer.Option("--seeds", help="Comma-separated seeds.")] = "0,1,2",
    steps: Annotated[int, typer.Option("--steps", help="Adam steps per model.")] = 4000,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Sequences per Adam step of each toy model: a training hyperparameter.")] = 256,
    threads: Annotated[Optional[int], typer.Option("--threads", help="torch threads per training process [default: 1].")] = None,
    jobs: Annotated[Optional[int], typer.Option("--jobs", "-j", help="Training processes, one (condition, load) group each [default: one per CPU].", rich_help_panel=EXECUTOR_PANEL)] = None,
    out: Annotated[str, typer.Option("--out", "-o", help="Output folder (toy.csv, toy_summary.csv, toy.md, toy.png).", rich_help_panel=OUTPUT_PANEL)] = "reports/toy",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the toy task's earlier output in --out (never a folder holding files sinkscope did not write).", rich_help_panel=OUTPUT_PANEL)] = False,
    **executor_options,
) -> None:
    """Wang 2026's toy superposition task: error by load per variant and the share of headroom closed.

    Examples:

    \b
        sinkscope toy

    \b
        sinkscope toy --loads 1,8 --seeds 0 --steps 500 --out reports/toy-quick
    """
    from sinkscope.executors.settings import choose_executor
    from sinkscope.lab.sweep import parse_list
    from sinkscope.lab.toy import ToyOptions, run_toy

    executor_options = choose_executor(executor_options)  # --jobs stays the toy's own (its local processes)

    options = ToyOptions(loads=parse_list(loads, "loads", int), conditions=parse_list(conditions, "conditions"),
                         variants=parse_list(variants, "variants"), seeds=parse_list(seeds, "seeds", int),
                         steps=steps, batch_size=batch_size, threads=threads, jobs=jobs, out=out, overwrite=overwrite)
    typer.echo(str(run_toy(options, log=lambda message: typer.echo(message, err=True), executor_options=executor_options)))


@app.command("run", cls=PanelledCommand)
@_friendly_errors
@executor_params()
def run_recipe_command(
    recipe: Annotated[list[str], typer.Argument(help="One or more recipe TOML files, e.g. recipes/sinks-smollm2.toml, run in order.")],
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override an option: key=value (repeatable); applies to every recipe given.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="The MODEL of the recipes' measuring steps (the same as --set model=...).")] = None,
    trust_remote_code: Annotated[bool, typer.Option("--trust-remote-code", help="Let the steps' models (and a train step's --tokenizer folder) run their own Python code; a recipe's trust_remote_code = true needs this.")] = False,
    plugin: Annotated[Optional[list[str]], typer.Option("--plugin", help="A probe plugin file for the measure steps (repeatable); a recipe's plugins = [...] must be given here too.")] = None,
    allow_recipe_code: Annotated[bool, typer.Option("--allow-recipe-code", help="Run the code the recipes name (trust_remote_code, plugins) without repeating it here.")] = False,
    allow_recipe_executor: Annotated[bool, typer.Option("--allow-recipe-executor", help="Let the recipes' steps choose where their runs go (a sweep step's launcher = \"submitit\", slurm = [...], an executor or its SLURM or Ray options); without it such a step is refused, and --executor here decides.")] = False,
    **executor_options,
) -> None:
    """Run probe recipes (TOML files naming a command and its options, or steps).

    A measuring step without an `out` writes to reports/<time>-<command>-<recipe>-<model>-...: the recipe's
    name is in the run folder's name. A recipe is a file someone hands you, like a model: code it
    names (trust_remote_code = true, plugins = [...]) runs only with --trust-remote-code, --plugin
    or --allow-recipe-code, and the run first says which code it runs. Where the runs go is the
    command line's to say (--executor): a step that picks an executor, a launcher, or SLURM or Ray
    options runs only with --allow-recipe-executor.

    Examples:

    \b
        sinkscope run recipes/sinks-smollm2.toml

    \b
        sinkscope run recipes/sinks-smollm2.toml recipes/sinks-smollm2-bos.toml --model EleutherAI/pythia-160m   # needs: weights

    \b
        sinkscope run recipes/sinks-smollm2.toml --set n_seqs=4 --set out=runs/quick
    """
    import json

    from sinkscope.executors.settings import choose_executor
    from sinkscope.lab.recipes import run_recipes

    executor_options = choose_executor(executor_options)
    overrides = list(set_ or []) + ([f"model={json.dumps(model)}"] if model is not None else [])
    for result in run_recipes(recipe, overrides, log=lambda message: typer.echo(message, err=True),
                              allow_code=allow_recipe_code, trust_remote_code=trust_remote_code,
                              plugins=tuple(plugin or ()), executor_options=executor_options,
                              allow_recipe_executor=allow_recipe_executor):
        typer.echo(str(result))


