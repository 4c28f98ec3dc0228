"""voc_annotation.py and coco_annotation.py on tiny generated datasets."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from keras_yolo_mgpu.cli import coco as coco_annotation
from keras_yolo_mgpu.cli import voc as voc_annotation
from keras_yolo_mgpu.data.annotations import read_annotations
from keras_yolo_mgpu.data.coco import category_mapping, check_class_order, coco_lines
from keras_yolo_mgpu.data.voc import parse_voc_xml
from keras_yolo_mgpu.resources import get_classes, model_data_path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOC_CLASSES = get_classes(model_data_path("voc_classes.txt"))


def voc_xml(objects, filename=None):
    parts = ["<annotation>", "<folder>VOC2007</folder>"]
    if filename:
        parts.append(f"<filename>{filename}</filename>")
    parts.append("<size><width>500</width><height>375</height><depth>3</depth></size>")
    for name, box, difficult in objects:
        parts.append(
            f"<object><name>{name}</name><pose>Left</pose><truncated>0</truncated>"
            + ("" if difficult is None else f"<difficult>{difficult}</difficult>")
            + "<bndbox>"
            + "".join(f"<{t}>{v}</{t}>" for t, v in zip(("xmin", "ymin", "xmax", "ymax"), box))
            + "</bndbox></object>"
        )
    parts.append("</annotation>")
    return "\n".join(parts)


OBJECTS = [
    ("dog", (48, 240, 195, 371), 0),
    ("person", (8, 12, 352, 498), 1),  # difficult
    ("unicorn", (1, 1, 5, 5), 0),  # not a VOC class
    ("cat", (10.5, 20, 30, 40.25), None),  # no <difficult>: not difficult
]


def test_parse_voc_xml_skips_difficult_and_unknown(tmp_path):
    path = tmp_path / "a.xml"
    path.write_text(voc_xml(OBJECTS, "a.jpg"))
    image = parse_voc_xml(str(path), VOC_CLASSES)
    dog, cat, person = (VOC_CLASSES.index(n) for n in ("dog", "cat", "person"))
    np.testing.assert_array_equal(image.boxes, [[48, 240, 195, 371, dog], [10.5, 20, 30, 40.25, cat]])
    assert image.filename == "a.jpg" and image.difficult_skipped == 1 and image.unknown == ["unicorn"]
    kept = parse_voc_xml(str(path), VOC_CLASSES, keep_difficult=True)
    assert kept.boxes[:, 4].tolist() == [dog, person, cat] and kept.difficult_skipped == 0


def make_devkit(root):
    voc = root / "VOCdevkit" / "VOC2007"
    for sub in ("Annotations", "ImageSets/Main", "JPEGImages"):
        (voc / sub).mkdir(parents=True)
    (voc / "Annotations" / "000001.xml").write_text(voc_xml(OBJECTS[:2]))
    (voc / "Annotations" / "000002.xml").write_text(voc_xml([("person", (8, 12, 352, 498), 1)]))
    (voc / "ImageSets" / "Main" / "train.txt").write_text("000001\n000002\n")
    (voc / "ImageSets" / "Main" / "val.txt").write_text("000002\n")
    return root / "VOCdevkit"


def test_voc_devkit_cli(tmp_path, caplog):
    devkit = make_devkit(tmp_path)
    out = tmp_path / "lists"
    with caplog.at_level(logging.INFO):
        assert (
            voc_annotation.main(["--devkit", str(devkit), "--sets", "2007_train", "2007_val", "--output-dir", str(out)])
            == 0
        )
    assert sorted(os.listdir(out)) == ["2007_train.txt", "2007_val.txt"]
    first, second = read_annotations(str(out / "2007_train.txt"))
    jpegs = devkit / "VOC2007" / "JPEGImages"
    assert first.image_path == str(jpegs / "000001.jpg")
    np.testing.assert_array_equal(first.boxes, [[48, 240, 195, 371, VOC_CLASSES.index("dog")]])
    assert second.image_path == str(jpegs / "000002.jpg") and len(second.boxes) == 0  # background image
    assert "2 difficult objects skipped" in caplog.text

    assert (
        voc_annotation.main(
            ["--devkit", str(devkit), "--sets", "2007_val", "--output-dir", str(out), "--keep-difficult"]
        )
        == 0
    )
    (only,) = read_annotations(str(out / "2007_val.txt"))
    assert only.boxes[:, 4].tolist() == [VOC_CLASSES.index("person")]


def test_voc_xml_dir_mode(tmp_path, caplog):
    xml_dir = tmp_path / "labels"
    xml_dir.mkdir()
    (xml_dir / "b.xml").write_text(voc_xml([("widget", (1, 2, 3, 4), 0)], "b.png"))
    (xml_dir / "a.xml").write_text(voc_xml([("gadget", (5, 6, 7, 8), None), ("widget", (1, 1, 9, 9), 0)]))
    (xml_dir / "notes.txt").write_text("ignored")
    classes = tmp_path / "classes.txt"
    classes.write_text("widget\ngadget\n")
    output = tmp_path / "train.txt"
    with caplog.at_level(logging.WARNING):
        assert (
            voc_annotation.main(
                ["--xml-dir", str(xml_dir), "--image-dir", "images", "--classes", str(classes), "--output", str(output)]
            )
            == 0
        )
    assert output.read_text() == "images/a.jpg 5,6,7,8,1 1,1,9,9,0\nimages/b.png 1,2,3,4,0\n"
    assert "2 of 2 images named by the XML files do not exist" in caplog.text


def test_voc_xml_dir_takes_the_xml_class_names_or_refuses_a_list_that_matches_none(tmp_path, capsys):
    xml_dir = tmp_path / "annots"
    xml_dir.mkdir()
    (xml_dir / "a.xml").write_text(voc_xml([("kangaroo", (5, 6, 7, 8), 0), ("emu", (1, 1, 9, 9), 0)]))
    output = tmp_path / "train.txt"
    argv = ["--xml-dir", str(xml_dir), "--image-dir", "images", "--output", str(output)]
    assert voc_annotation.main(argv) == 0
    assert output.read_text() == "images/a.jpg 5,6,7,8,1 1,1,9,9,0\n"  # emu 0, kangaroo 1: sorted names
    assert (tmp_path / "train_classes.txt").read_text() == "emu\nkangaroo\n"
    output.unlink()
    voc = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "model_data", "voc_classes.txt")
    assert voc_annotation.main([*argv, "--classes", voc]) == 1
    assert "none of the classes the XML files name (emu, kangaroo) is in --classes" in capsys.readouterr().err
    assert not output.exists()  # never a file of images without boxes


def test_voc_cli_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        voc_annotation.main(["--devkit", "x", "--sets", "2007"])
    with pytest.raises(SystemExit):
        voc_annotation.main(["--xml-dir", "x"])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.xml").write_text("<annotation><object><name>dog</name></object></annotation>")
    assert voc_annotation.main(["--xml-dir", str(bad), "--image-dir", "i", "--output", str(tmp_path / "o.txt")]) == 1
    assert "object 'dog' has no <bndbox>" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# COCO
# ---------------------------------------------------------------------------

# COCO 2017's 80 names; ids 1..90 with 12, 26, 29, 30, 45, 66, 68, 69, 71, 83 unused.
COCO_NAMES = [
    name.replace("_", " ")
    for name in (
        "person bicycle car motorcycle airplane bus train truck boat traffic_light fire_hydrant stop_sign "
        "parking_meter bench bird cat dog horse sheep cow elephant bear zebra giraffe backpack umbrella handbag "
        "tie suitcase frisbee skis snowboard sports_ball kite baseball_bat baseball_glove skateboard surfboard "
        "tennis_racket bottle wine_glass cup fork knife spoon bowl banana apple sandwich orange broccoli carrot "
        "hot_dog pizza donut cake chair couch potted_plant bed dining_table toilet tv laptop mouse remote keyboard "
        "cell_phone microwave oven toaster sink refrigerator book clock vase scissors teddy_bear hair_drier toothbrush"
    ).split()
]
COCO_IDS = [i for i in range(1, 91) if i not in (12, 26, 29, 30, 45, 66, 68, 69, 71, 83)]


def coco_json(categories, annotations, images):
    return {"images": images, "annotations": annotations, "categories": categories}


def real_categories(shuffle_seed=0):
    cats = [{"id": i, "name": n, "supercategory": "x"} for i, n in zip(COCO_IDS, COCO_NAMES)]
    order = np.random.default_rng(shuffle_seed).permutation(len(cats))
    return [cats[i] for i in order]  # the mapping must not depend on list order


def test_coco_mapping_from_sorted_ids_matches_coco_classes_txt(caplog):
    id_to_index, names = category_mapping(real_categories())
    assert len(id_to_index) == 80
    assert (id_to_index[1], id_to_index[13], id_to_index[90]) == (0, 11, 79)
    assert (names[11], names[79]) == ("stop sign", "toothbrush")
    with caplog.at_level(logging.INFO):
        check_class_order(names, get_classes(model_data_path("coco_classes.txt")))
    assert "3: motorcycle/motorbike" in caplog.text  # spelt differently, same place


def test_coco_class_order_mismatch_is_an_error():
    names = category_mapping(real_categories())[1]
    swapped = list(get_classes(model_data_path("coco_classes.txt")))
    swapped[0], swapped[2] = swapped[2], swapped[0]
    with pytest.raises(ValueError, match="'person' is 0 in the JSON but 2 in"):
        check_class_order(names, swapped)
    short = get_classes(model_data_path("coco_classes.txt"))[:-1]
    with pytest.raises(ValueError, match="has 80 categories but classes file lists 79"):
        check_class_order(names, short)
    check_class_order(names, swapped[:-1], strict=False)  # another dataset: not compared


def test_coco_lines_boxes_crowd_and_empty():
    cats = [{"id": 90, "name": "toothbrush"}, {"id": 1, "name": "person"}, {"id": 3, "name": "car"}]
    images = [{"id": 7, "file_name": "b.jpg"}, {"id": 5, "file_name": "a.jpg"}, {"id": 9, "file_name": "empty.jpg"}]
    anns = [
        {"id": 1, "image_id": 5, "category_id": 90, "bbox": [473.07, 395.93, 38.65, 28.67], "iscrowd": 0},
        {"id": 2, "image_id": 5, "category_id": 1, "bbox": [10, 20, 30, 40], "iscrowd": 1},  # crowd
        {"id": 3, "image_id": 7, "category_id": 3, "bbox": [1, 2, 3, 4]},
        {"id": 4, "image_id": 7, "category_id": 1, "bbox": [1, 2, 0, 4]},  # zero width
        {"id": 5, "image_id": 9, "category_id": 1, "bbox": [0, 0, 5, 5], "iscrowd": 1},
    ]
    lines, names = coco_lines(coco_json(cats, anns, images), "imgs")
    assert names == ["person", "car", "toothbrush"]
    assert lines == [
        "imgs/b.jpg 1,2,4,6,1",
        "imgs/a.jpg 473.07,395.93,511.72,424.6,2",
    ]
    lines, _ = coco_lines(coco_json(cats, anns, images), "imgs", keep_empty=True)
    assert lines[-1] == "imgs/empty.jpg"


def test_coco_script(tmp_path):
    cats = real_categories(1)
    anns = [
        {"id": 1, "image_id": 1, "category_id": 90, "bbox": [1.5, 2, 3, 4], "iscrowd": 0},
        {"id": 2, "image_id": 1, "category_id": 13, "bbox": [0, 0, 10, 10], "iscrowd": 0},
    ]
    instances = tmp_path / "instances.json"
    instances.write_text(json.dumps(coco_json(cats, anns, [{"id": 1, "file_name": "000000000001.jpg"}])))
    output, names = tmp_path / "train.txt", tmp_path / "names.txt"
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "coco_annotation.py"),
            "--instances",
            str(instances),
            "--image-dir",
            str(tmp_path / "train2017"),
            "--output",
            str(output),
            "--classes-output",
            str(names),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    (annotation,) = read_annotations(str(output))
    assert annotation.image_path == str(tmp_path / "train2017" / "000000000001.jpg")
    np.testing.assert_array_equal(annotation.boxes, [[1.5, 2, 4.5, 6, 79], [0, 0, 10, 10, 11]])
    assert names.read_text().splitlines() == COCO_NAMES

    swapped = tmp_path / "swapped.txt"
    swapped.write_text("\n".join([COCO_NAMES[1], COCO_NAMES[0], *COCO_NAMES[2:]]) + "\n")
    assert (
        coco_annotation.main(
            [
                "--instances",
                str(instances),
                "--image-dir",
                "x",
                "--output",
                str(tmp_path / "o.txt"),
                "--classes",
                str(swapped),
            ]
        )
        == 1
    )
    assert not (tmp_path / "o.txt").exists()
