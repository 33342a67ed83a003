"""Every benchmark metric on hand-made scores with known answers, ties included (a tie is wrong)."""

import pytest
import torch

from components.suite import metrics as bm

T = torch.tensor


def test_pairwise_accuracy_counts_a_tie_as_wrong():
    assert bm.pairwise_accuracy(T([0.9, 0.5, 0.3, 0.7]), T([0.1, 0.5, 0.4, 0.2])) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="empty benchmark"):
        bm.pairwise_accuracy(T([]), T([]))
    with pytest.raises(ValueError, match="one shape"):
        bm.pairwise_accuracy(T([1.0]), T([1.0, 2.0]))


def test_sugarcrepe_pp_itt_and_tot():
    # item 0: both positives beat the negative, texts agree; item 1: P2 ties N (ITT wrong), TOT right;
    # item 2: ITT right, P1–P2 ties P1–N (TOT wrong); item 3: everything wrong
    out = bm.sugarcrepe_pp(
        image_p1=T([0.9, 0.8, 0.7, 0.1]), image_p2=T([0.8, 0.5, 0.6, 0.2]), image_n=T([0.1, 0.5, 0.2, 0.3]),
        p1_p2=T([0.9, 0.9, 0.6, 0.1]), p1_n=T([0.2, 0.3, 0.6, 0.5]), p2_n=T([0.3, 0.4, 0.1, 0.5]),
    )
    assert out == {"itt": pytest.approx(0.5), "tot": pytest.approx(0.5)}


def test_hard_positives_original_augmented_and_brittleness():
    caption = T([0.9, 0.9, 0.5, 0.6, 0.4])
    positive = T([0.8, 0.3, 0.9, 0.6, 0.2])
    negative = T([0.1, 0.5, 0.7, 0.6, 0.3])
    # original: c > c_n for items 0, 1 (0.9 > 0.5); not 2 (0.5 < 0.7), 3 (tie), 4 (0.4 > 0.3 yes) → 3/5
    # augmented: also c_p > c_n: item 0 yes, 1 no (0.3), 4 no (0.2) → 1/5
    # brittleness: c_n strictly between c and c_p: item 1 (0.3 < 0.5 < 0.9), 2 (0.5 < 0.7 < 0.9), 4 (0.2 < 0.3 < 0.4); 3 ties → 3/5
    out = bm.hard_positives(caption, positive, negative)
    assert out == {"original_acc": pytest.approx(0.6), "augmented_acc": pytest.approx(0.2), "brittleness": pytest.approx(0.6)}


def test_macro_accuracy_weights_groups_equally():
    correct = T([1, 1, 1, 0, 0])
    out = bm.macro_accuracy(correct, ["on", "on", "on", "on", "under"])
    assert out["macro_acc"] == pytest.approx((0.75 + 0.0) / 2) and out["micro_acc"] == pytest.approx(0.6)
    assert out["groups"] == 2 and out["macro_acc_all_groups"] == out["macro_acc"]
    counted = bm.macro_accuracy(correct, ["on", "on", "on", "on", "under"], counted={"on"})
    assert counted["macro_acc"] == pytest.approx(0.75) and counted["groups"] == 1
    assert counted["macro_acc_all_groups"] == pytest.approx(0.375)
    assert "macro_acc" not in bm.macro_accuracy(correct, ["on"] * 5, counted={"under"})  # no counted group present
    with pytest.raises(ValueError, match="group labels"):
        bm.macro_accuracy(correct, ["on"])


def test_order_precision_at_1_is_the_argmax_with_the_true_caption_first():
    true = T([0.9, 0.5, 0.7])
    shuffled = T([[0.1, 0.2, 0.3, 0.4], [0.1, 0.5, 0.2, 0.3], [0.8, 0.1, 0.1, 0.1]])  # win, tie, loss
    assert bm.order_precision_at_1(true, shuffled) == pytest.approx(2 / 3)  # ARO: a tie keeps the true caption
    assert bm.order_precision_at_1(true, shuffled, ties_count_right=False) == pytest.approx(1 / 3)


def test_winoground_text_image_and_group_scores():
    scores = T([
        [[0.9, 0.1], [0.2, 0.8]],  # all right
        [[0.9, 0.5], [0.95, 0.6]],  # image 1 prefers caption 0 (0.95 > 0.6): text wrong; caption 0 prefers image 1: image wrong
        [[0.6, 0.5], [0.5, 0.6]],  # text right, image right
        [[0.7, 0.2], [0.7, 0.8]],  # text right; image: 0.7 > 0.7 tie → wrong
    ])
    assert bm.winoground(scores) == {"text": pytest.approx(0.75), "image": pytest.approx(0.5), "group": pytest.approx(0.5)}
    with pytest.raises(ValueError, match=r"\[N, 2, 2\]"):
        bm.winoground(torch.zeros(3, 2))


def test_topk_accuracy_with_ties_against_the_true_class():
    logits = T([
        [0.9, 0.1, 0.0, 0.0, 0.0, 0.0],  # true 0: top1
        [0.5, 0.6, 0.7, 0.8, 0.9, 0.4],  # true 5: rank 5 → miss top5
        [0.3, 0.3, 0.0, 0.0, 0.0, 0.0],  # true 1 ties class 0 → not top1, top5 yes
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.05],  # true 0: four above → top5 yes
    ])
    out = bm.topk_accuracy(logits, T([0, 5, 1, 0]), ks=(1, 5))
    assert out == {"top1": pytest.approx(0.25), "top5": pytest.approx(0.75)}


def test_retrieval_recall_both_directions():
    # 3 images, 5 texts; text→image = [0, 0, 1, 2, 2]
    sim = T([
        [0.9, 0.1, 0.8, 0.0, 0.0],  # image 0: own best 0.9 is first → R@1
        [0.2, 0.3, 0.4, 0.5, 0.1],  # image 1: own text 2 (0.4) below text 3 (0.5) → rank 1
        [0.1, 0.2, 0.3, 0.6, 0.6],  # image 2: own texts 3, 4 at 0.6, no other text ≥ 0.6 → R@1
    ])
    text_image = T([0, 0, 1, 2, 2])
    out = bm.retrieval_recall(sim, text_image, ks=(1, 2))
    assert out["image_to_text_r1"] == pytest.approx(2 / 3) and out["image_to_text_r2"] == pytest.approx(1.0)
    # text→image: t0 → col [0.9, 0.2, 0.1] R@1; t1 → [0.1, 0.3, 0.2] own 0.1 is last (rank 2);
    # t2 → [0.8, 0.4, 0.3] own image 1 rank 1; t3 → [0, 0.5, 0.6] R@1; t4 → [0, 0.1, 0.6] R@1
    assert out["text_to_image_r1"] == pytest.approx(3 / 5) and out["text_to_image_r2"] == pytest.approx(4 / 5)
    # a tie with another image ranks pessimistically
    tie = bm.retrieval_recall(T([[0.5, 0.5], [0.5, 0.5]]), T([0, 1]), ks=(1,))
    assert tie == {"image_to_text_r1": 0.0, "text_to_image_r1": 0.0}
    with pytest.raises(ValueError, match="at least one caption"):
        bm.retrieval_recall(torch.zeros(2, 2), T([0, 0]))


def test_retrieval_recall_over_query_subset_ranks_against_every_candidate():
    # image 0 owns texts 0, 1; image 1 owns text 2. Text 1 prefers image 1; image 1 prefers text 1.
    sim = torch.tensor([[0.9, 0.3, 0.0],
                        [0.0, 0.95, 0.8]])
    owner = torch.tensor([0, 0, 1])
    full = bm.retrieval_recall(sim, owner, ks=(1,))
    assert full == {"image_to_text_r1": 0.5, "text_to_image_r1": pytest.approx(2 / 3)}
    only_1 = bm.retrieval_recall(sim, owner, ks=(1,), queries=torch.tensor([False, True]))
    assert only_1 == {"image_to_text_r1": 0.0, "text_to_image_r1": 1.0}  # text 2 still competes with image 0
    only_0 = bm.retrieval_recall(sim, owner, ks=(1,), queries=torch.tensor([True, False]))
    assert only_0 == {"image_to_text_r1": 1.0, "text_to_image_r1": 0.5}
    with pytest.raises(ValueError, match="no query images"):
        bm.retrieval_recall(sim, owner, queries=torch.tensor([False, False]))
