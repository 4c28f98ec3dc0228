"""Named training recipes: complete sets of defaults that `train.py --recipe NAME` selects.

A recipe gives a value to every `TrainConfig` field in `RECIPE_FIELDS`;
a flag given on the command line overrides its own field and nothing else.
The resolved values are what a run records in `args.json`, so a run
resumes and repeats without knowing which recipe named them.

- `default`: the best recipe measured on real photos fine-tuned from the
  official yolov3-tiny weights and on the demo's generated data
  (docs/training.md, "Measured"): one stage with nothing frozen, Adam at
  3e-3 from scratch and 1e-3 fine-tuning from `--weights`
  (`PRETRAINED_VALUES`), EMA 0.99 of the weights, the objectness prior 0.01 on the fresh
  output convolutions, Darknet's `iou_thresh` 0.213 anchor assignment,
  validation mAP every epoch and `best.weights.h5` kept by mAP@0.5, only
  `best` and `last` checkpoints.
- `keras-yolo3`: the original's recipe exactly (two stages, 50 + 50 epochs,
  all but the output convolutions frozen in stage 1, Adam 1e-3 then 1e-4
  with ReduceLROnPlateau and EarlyStopping on val_loss, best anchor only,
  zero output bias, a weights file per improving epoch).
"""

from __future__ import annotations

DEFAULT_RECIPE = "default"

# `freeze_epochs` given as a share of `epochs`, resolved once `epochs` is known.
HALF = "half"  # keras-yolo3: stage 1 is the first half
ALL = "all"  # one stage: every epoch is stage 1 (with freeze_body 0, nothing frozen)

RECIPES: dict[str, dict] = {
    "default": dict(
        epochs=100,
        freeze_epochs=ALL,
        freeze_body=0,
        lr1=3e-3,
        lr2=3e-4,
        eval_every=1,
        # mAP@0.5 picks best.weights.h5 (as Darknet's -map does): on real
        # photos mAP@[.5:.95] kept a later epoch with a lower mAP@0.5
        # (docs/training.md, "Measured").
        monitor="val_mAP50",
        ema=0.99,
        objectness_prior=0.01,
        iou_thresh=0.213,
        save_period=0,
        # Ends the one stage after 30 evaluations without a better val
        # mAP@0.5 (docs/training.md, "How long"): fine-tuned for 100 epochs,
        # the best came at epoch 59 on the raccoon photos (0.991) and 63 on
        # the kangaroo photos (0.899), after which mAP fell. 30 is the
        # smallest patience tried (5-30) that keeps both best epochs; 20
        # stopped the raccoon run at epoch 50 with epoch 30's 0.989 (mAP@[.5:.95]
        # 0.498 against 0.555).
        patience=30,
    ),
    "keras-yolo3": dict(
        epochs=100,
        freeze_epochs=HALF,
        freeze_body=2,
        lr1=1e-3,
        lr2=1e-4,
        eval_every=None,  # resolved from monitor: 0 with val_loss
        monitor="val_loss",
        ema=0.0,
        objectness_prior=0.0,
        iou_thresh=None,  # the model's: best anchor only for YOLOv3
        save_period=None,  # ep*.weights.h5 at every improvement
        patience=None,  # stage 2's EarlyStopping (early_stopping_patience 10) only
    ),
}
RECIPE_FIELDS = tuple(RECIPES[DEFAULT_RECIPE])
# A recipe's values that differ when the run starts from `--weights`. Fine-
# tuning the official yolov3-tiny weights, Adam 1e-3 beat 3e-3 on both real
# sets (raccoon, 16 epochs: mAP@0.5 0.971 against 0.915; kangaroo, 32 epochs:
# 0.880 against 0.850; docs/training.md, "Measured"): the larger step
# unlearns pretrained features the new data is too small to rebuild. From
# scratch 3e-3 stays (the demo's `lr3` row beats 2e-3).
PRETRAINED_VALUES: dict[str, dict] = {
    "default": dict(lr1=1e-3, lr2=1e-4),
}


def resolve_recipe(name: str, given: dict, pretrained: bool = False) -> dict:
    """The `TrainConfig` values of recipe `name` with the `given` fields overriding it.

    Args:
        name: a key of `RECIPES`.
        given: field -> value of the flags present on the command line (a
            value of None counts as not given).
        pretrained: the run starts from `--weights`: the recipe's
            `PRETRAINED_VALUES` replace its own.

    Returns:
        `{field: value}` for every field of `RECIPE_FIELDS` plus `recipe`,
        with `freeze_epochs` and `eval_every` resolved to integers.

    Raises:
        ValueError: an unknown recipe, or a given field no recipe sets.
    """
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; recipes: {', '.join(RECIPES)}")
    unknown = sorted(set(given) - set(RECIPE_FIELDS))
    if unknown:
        raise ValueError(f"recipes do not set {unknown}")
    recipe = {**RECIPES[name], **(PRETRAINED_VALUES.get(name, {}) if pretrained else {})}
    values = {**recipe, **{key: value for key, value in given.items() if value is not None}}
    if values["freeze_epochs"] == HALF:
        values["freeze_epochs"] = values["epochs"] // 2
    elif values["freeze_epochs"] == ALL:
        values["freeze_epochs"] = values["epochs"]
    if values["eval_every"] is None:
        values["eval_every"] = 1 if values["monitor"] in ("val_mAP", "val_mAP50") else 0
    return {"recipe": name, **values}
