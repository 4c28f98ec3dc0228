"""Named training recipes: complete sets of defaults that `train.py --recipe NAME` selects.

A recipe gives a value to every `TrainConfig` field in `RECIPE_FIELDS`;
a flag given on the command line overrides its own field and nothing else.
args.json records the resolved values, so a run resumes without the recipe.

- `default`: the best measured (docs/training.md, "Measured"): one stage with
  nothing frozen, EMA, objectness prior, Darknet's `iou_thresh` and
  `best.weights.h5` kept by validation mAP@0.5.
- `keras-yolo3`: the original's recipe exactly (two stages, 50 + 50 epochs,
  ReduceLROnPlateau and EarlyStopping on val_loss in stage 2).
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
        # As Darknet's -map does: on real photos mAP@[.5:.95] kept a later, worse epoch (docs/training.md).
        monitor="val_mAP50",
        ema=0.99,
        objectness_prior=0.01,
        iou_thresh=0.213,
        save_period=0,
        # The smallest patience tried that kept the best epoch of both real-photo
        # fine-tuning runs (docs/training.md, "How long").
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
# A recipe's values that differ when the run starts from `--weights`: fine-tuning, 1e-3 beat 3e-3 on both
# real sets (docs/training.md, "Measured"); the larger step unlearns pretrained features.
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
