"""The `paper` profiles say what the papers say: every config of every pFedSD notebook is checked
against a table of the settings stated in pFedSD Sec. 4.1 (and, where a table restates them, its caption)."""
import pytest

from pflrepro.pipeline import experiments

# Sec. 4.1: "We set the learning rate as 0.01 for all methods. We adopt the SGD optimizer with weight decay
# 1e-5 and momentum 0.9 ... The training batch size on all the tasks is B = 64." "Participating clients execute
# E = 5 epochs". "We report the results with mean and standard deviation over three different random seeds."
# "All datasets are split randomly by an 80-20 ratio for training and testing".
PFEDSD_COMMON = dict(lr=0.01, momentum=0.9, weight_decay=1e-5, batch_size=64, local_epochs=5, pool="train+test",
                     split="random", subsample=1.0)
PFEDSD_SEEDS = [0, 1, 2]
MODEL = {"fmnist": "cnn_fmnist", "cifar10": "cnn_cifar10", "cifar100": "cnn_cifar100"}   # author code's CNNs
# "K = 20 clients with r = 100% ... K = 100 clients with r = 10% ... T = 50 ... and T = 100"
SCALE = {"20 clients": (20, 1.0, 50), "100 clients": (100, 0.1, 100)}
# "The best mu of FedProx for Fashion-MNIST, CIFAR-10, and CIFAR-100 are 0.001, 0.01, 0.001."
FEDPROX_MU = {"fmnist": 0.001, "cifar10": 0.01, "cifar100": 0.001}
# "For FedPer, we keep the last two layers as the personalized head for Fashion-MNIST and the last linear layer for CIFAR."
FEDPER_HEAD = {"fmnist": 2, "cifar10": 1, "cifar100": 1}
# Tables 2, 3: both scales on the three datasets; Table 3: "s = 2 for CIFAR-10 and Fashion-MNIST, s = 20 for CIFAR-100"
PATHOLOGICAL_S = {"fmnist": 2, "cifar10": 2, "cifar100": 20}
ABLATION = (20, 0.6, 50)  # Tables 6 (r varies), 7, 8, 9, Fig. 8: K=20 (Table 6's r=60% column = Table 7's alpha=0.1)

PFEDSD_NOTEBOOKS = ["pfedsd_table2", "pfedsd_table3", "pfedsd_table6", "pfedsd_table7", "pfedsd_table8",
                    "pfedsd_table9", "pfedsd_fig2", "pfedsd_fig5", "pfedsd_fig8"]


def _paper(name):
    return experiments.grid(experiments.load_profile(name, "paper"))


@pytest.mark.parametrize("name", PFEDSD_NOTEBOOKS)
def test_pfedsd_paper_profile_common_settings(name):
    configs = _paper(name)
    assert sorted({seed for (_, _, seed) in configs}) == PFEDSD_SEEDS
    for key, cfg in configs.items():
        for field, want in PFEDSD_COMMON.items():
            assert getattr(cfg, field) == pytest.approx(want), (key, field)
        assert list(cfg.split_params["fractions"]) == [0.8, 0.2], key
        if cfg.model not in ("resnet8", "mobilenetv2"):
            assert cfg.model == MODEL[cfg.dataset], key
        hp = cfg.hparams
        if cfg.algorithm == "fedprox":
            assert hp["mu"] == FEDPROX_MU[cfg.dataset], key
        if cfg.algorithm == "fedper":
            assert hp["head_layers"] == (1 if cfg.model in ("resnet8", "mobilenetv2") else FEDPER_HEAD[cfg.dataset]), key
        if cfg.algorithm == "lg_fedavg":  # "we keep the last two layers as the shared head for all datasets"
            assert hp["head_layers"] == (1 if cfg.model in ("resnet8", "mobilenetv2") else 2), key
        if cfg.algorithm == "pfedsd" and name != "pfedsd_fig8":  # lambda in {0.1, 0.5}, tau in {1, 3}: 0.5, 3
            assert (hp["lam"], hp["tau"]) == (0.5, 3.0), key
        if cfg.algorithm == "pfedme":  # "the regularization parameter lambda is selected from [15,20,30]"
            assert hp["lam"] in (15.0, 20.0, 30.0), key
        if cfg.algorithm == "fedfomo":  # "M = 5, eps-greedy parameter eps = 0.3 with 0.05 decay each round"
            assert (hp["M"], hp["eps"], hp["eps_decay"]) == (5, 0.3, 0.05), key


@pytest.mark.parametrize("name", ["pfedsd_table2", "pfedsd_table3"])
def test_pfedsd_tables_2_3_scales_and_partitions(name):
    configs = _paper(name)
    methods = {m for (m, _, _) in configs}
    assert methods == {"fedavg", "fedprox", "fedper", "lg_fedavg", "pfedme", "fedfomo", "pfedsd"}  # Table 2's columns
    cells = {(cfg.dataset, s.split(" ", 1)[1]) for (_, s, _), cfg in configs.items()}
    assert cells == {(d, sc) for d in MODEL for sc in SCALE}
    for (m, setting, seed), cfg in configs.items():
        assert (cfg.n_clients, cfg.participation, cfg.rounds) == SCALE[setting.split(" ", 1)[1]]
        if name == "pfedsd_table2":
            assert cfg.partition == "balanced_dirichlet" and cfg.partition_params["alpha"] == 0.1
        else:
            assert cfg.partition == "shards" and cfg.partition_params["s"] == PATHOLOGICAL_S[cfg.dataset]


def test_pfedsd_ablation_tables():
    t6 = _paper("pfedsd_table6")
    assert {(c.dataset, c.n_clients, c.participation, c.rounds) for c in t6.values()} == \
        {("cifar100", 20, r, 50) for r in (0.2, 0.6, 1.0)}
    t7 = _paper("pfedsd_table7")
    assert {(c.dataset, c.partition_params["alpha"]) for c in t7.values()} == {("cifar100", a) for a in (0.01, 0.1, 1.0)}
    assert {(c.n_clients, c.participation, c.rounds) for c in t7.values()} == {ABLATION}
    t8 = _paper("pfedsd_table8")
    assert {(c.dataset, c.model) for c in t8.values()} == {("cifar100", "resnet8"), ("cifar100", "mobilenetv2")}
    t9 = _paper("pfedsd_table9")
    assert {c.hparams["reg"] for c in t9.values()} == {"l2", "ewc", "mse", "kl"}
    assert {c.dataset for c in t9.values()} == set(MODEL)
    f8 = _paper("pfedsd_fig8")  # "a set of lambda selected from {0.01, 0.1, 0.5, 1} and tau from {1, 3}"
    assert {(c.hparams["lam"], c.hparams["tau"]) for c in f8.values()} == \
        {(lam, tau) for lam in (0.01, 0.1, 0.5, 1.0) for tau in (1.0, 3.0)}
    f2 = _paper("pfedsd_fig2")  # "FedAvg is applied on CIFAR-10 and CIFAR-100 with 100 non-IID clients"
    assert {(c.dataset, c.n_clients) for c in f2.values()} == {("cifar10", 100), ("cifar100", 100)}
    f5 = _paper("pfedsd_fig5")  # "among 20 clients on the CIFAR-10 dataset"
    assert {(c.dataset, c.n_clients, c.partition) for c in f5.values()} == {("cifar10", 20, "balanced_dirichlet")}


@pytest.mark.parametrize("name", ["pfedsd_table4", "pfedsd_table5", "pfedsd_fig6", "pfedsd_fig7"])
def test_rendered_from_table2_runs(name):
    """Tables 4, 5 and Figs. 6, 7 render Table 2's runs: identical configs in every profile."""
    for prof in experiments.PROFILES:
        a = experiments.grid(experiments.load_profile(name, prof))
        b = experiments.grid(experiments.load_profile("pfedsd_table2", prof))
        assert {k: c.key() for k, c in a.items()} == {k: c.key() for k, c in b.items()}


# ---------------------------------------------------------------- DC-PFL (IJCAI 2024), Sec. 6.1
# "in CIFAR-10, each client is allocated data from only 2 classes (non-IID: 2/10), while in CIFAR-100, each client
# receives data from only 10 classes"; "8:1:1 allocation ratio"; "a fixed learning rate of 0.01"; "T is set to 100
# on CIFAR-10 and to 500 on CIFAR-100"; "the number of participating clients per round is fixed at 10".
DCPFL_CLASSES = {"cifar10": 2, "cifar100": 10}
DCPFL_ROUNDS = {"cifar10": 100, "cifar100": 500}
DCPFL_SCALES = {(10, 1.0), (50, 0.2), (100, 0.1)}
HETERO = ("cnn1", "cnn2", "cnn3", "cnn4", "cnn5")


@pytest.mark.parametrize("name", ["dcpfl_table1", "dcpfl_table2", "dcpfl_table3", "dcpfl_fig2", "dcpfl_fig3"])
def test_dcpfl_paper_profile_settings(name):
    configs = _paper(name)
    for key, cfg in configs.items():
        assert cfg.dataset in DCPFL_CLASSES and cfg.lr == 0.01, key
        assert list(cfg.split_params["fractions"]) == [0.8, 0.1, 0.1] and cfg.split == "random", key
        assert cfg.partition == "classes_uniform_shares", key
        assert (cfg.partition_params["low"], cfg.partition_params["high"]) == (0.4, 0.6), key   # FedGH's shares
        assert cfg.rounds == DCPFL_ROUNDS[cfg.dataset], key
        if name != "dcpfl_fig2":
            assert cfg.partition_params["classes_per_client"] == DCPFL_CLASSES[cfg.dataset], key
        if name in ("dcpfl_table1", "dcpfl_table3"):
            assert (cfg.n_clients, cfg.participation) in DCPFL_SCALES, key
            assert round(cfg.n_clients * cfg.participation) == 10 and cfg.model == "cnn1" and not cfg.models, key
        if name == "dcpfl_table2":
            assert cfg.models == HETERO and cfg.algorithm != "fedavg", key
        if cfg.algorithm == "dcpfl" and name != "dcpfl_table3":
            assert cfg.hparams["n_virtual"] == 1000, key   # "we set sum |G_c| = 1,000"
    if name == "dcpfl_table1":
        assert {m for (m, _, _) in configs} == {"local", "fedavg", "fml", "fedkd", "lg_fedavg", "fd", "fedproto",
                                                 "fedgh", "dcpfl", "dcpfl_wo_al", "dcpfl_wo_gc"}
        assert {(c.hparams["lam"], c.hparams["calibrate"]) for (m, _, _), c in configs.items() if m == "dcpfl_wo_al"} \
            == {(0.0, True)}
        assert {c.hparams["calibrate"] for (m, _, _), c in configs.items() if m == "dcpfl_wo_gc"} == {False}
    if name == "dcpfl_table3":
        assert {c.hparams["n_virtual"] for c in configs.values() if c.algorithm == "dcpfl"} == {600, 800, 1000, 2000, 5000}
        assert {c.dataset for c in configs.values()} == {"cifar100"}
    if name == "dcpfl_fig2":  # "{2, 4, 6, 8, 10} classes" / "{10, 30, 50, 70, 90, 100} classes", K=10, 100%
        got = {(c.dataset, c.partition_params["classes_per_client"]) for c in configs.values()}
        assert got == {("cifar10", s) for s in (2, 4, 6, 8, 10)} | {("cifar100", s) for s in (10, 30, 50, 70, 90, 100)}
        assert {(c.n_clients, c.participation) for c in configs.values()} == {(10, 1.0)}
    if name == "dcpfl_fig3":  # "|K| = 100 ... {0.1, 0.3, 0.5, 0.7, 0.9, 1}"
        assert {(c.n_clients, c.participation) for c in configs.values()} == \
            {(100, r) for r in (0.1, 0.3, 0.5, 0.7, 0.9, 1.0)}


# PerFed-CKT appendix E and Sec. 5: K = 100, C = 0.10 / 0.15, 500 rounds, 3 seeds, m clients drawn by data share,
# split {0.1, 0.3, 0.4} / 0.1 / 0.5, "we do not apply any momentum acceleration or weight decay", eta = 0.001,
# b = 64, tau = 50, b' = 128, lambda = 2, 2,000 unlabeled CIFAR-100 images; VGG11 (Table 1) and VGG13 / VGG11 / CNN
# (Table 2); alpha = 0.01.
CKT_COMMON = dict(dataset="cifar10", n_clients=100, rounds=500, sampling="data_share", split="perfed_ckt",
                  momentum=0.0, weight_decay=0.0, lr=0.001, batch_size=64, subsample=1.0)
CKT_HP = dict(tau=50, public_batch=128, lam=2.0, output="softmax")


@pytest.mark.parametrize("name, models", [("perfed_ckt_table1", ()), ("perfed_ckt_table2", ("vgg13", "vgg11", "cnn_ckt"))])
def test_perfed_ckt_paper_profile_settings(name, models):
    configs = _paper(name)
    assert sorted({seed for (_, _, seed) in configs}) == [0, 1, 2]
    assert {(s, c.participation) for (_, s, _), c in configs.items()} == {("C=0.10", 0.10), ("C=0.15", 0.15)}
    clusters = set()
    for key, cfg in configs.items():
        for field, want in CKT_COMMON.items():
            assert getattr(cfg, field) == pytest.approx(want) if isinstance(want, float) else getattr(cfg, field) == want, (key, field)
        assert cfg.model == "vgg11" and cfg.models == models, key
        assert cfg.partition_params["alpha"] == 0.01, key
        assert list(cfg.split_params["train_choices"]) == [0.1, 0.3, 0.4] and cfg.split_params["val_fraction"] == 0.1 \
            and cfg.split_params["test_fraction"] == 0.5, key
        assert cfg.public == {"dataset": "cifar100", "split": "train", "size": 2000}, key
        if cfg.algorithm == "perfed_ckt":
            assert {k: cfg.hparams[k] for k in CKT_HP} == CKT_HP, key
            clusters.add(cfg.hparams["clusters"])
    assert clusters == {1, 2, 3, 4}


# FedBSD Table 1 defers its setup to FedRep (Collins et al. 2021; FedBSD Sec. 4.1 "as in (Collins et al., 2021)").
# FedRep's settings, one row per Table 1 column: dataset, N, S, model, body epochs a round (FedBSD: "one round of
# backbone optimization is performed for the CIFAR10 case with [S = 2], and 5 ... for all other cases"), partition.
FEDREP_SETTINGS = {
    "cifar10 N=100 S=2": ("cifar10", 100, 2, "cnn_fedrep", 1, "n_by_s"),
    "cifar10 N=100 S=5": ("cifar10", 100, 5, "cnn_fedrep", 5, "n_by_s"),
    "cifar10 N=1000 S=2": ("cifar10", 1000, 2, "cnn_fedrep", 1, "n_by_s"),
    "cifar100 N=100 S=5": ("cifar100", 100, 5, "cnn_fedrep", 5, "n_by_s"),
    "cifar100 N=100 S=20": ("cifar100", 100, 20, "cnn_fedrep", 5, "n_by_s"),
    # "10 handwritten letters ... log-normal ... 150 clients with 3 classes per client", "MLP with two hidden layers"
    "femnist N=150 S=3": ("femnist", 150, 3, "mlp2", 5, "lognormal"),
}
# "10% participation, batch 10, SGD lr 0.01 momentum 0.5" (FedRep), weight decay 1e-4 (FedRep's code); the head
# trains 10 epochs a round ("the private head requires 10 rounds of updates"), 10 epochs of FT for the +FT rows.
FEDREP_COMMON = dict(participation=0.1, batch_size=10, lr=0.01, momentum=0.5, weight_decay=1e-4, pool="train",
                     split="global_test_by_proportion", subsample=1.0)


def test_fedbsd_paper_profile_is_fedreps_settings():
    configs = _paper("fedbsd_table1")
    assert {s for (_, s, _) in configs} == set(FEDREP_SETTINGS)
    assert sorted({seed for (_, _, seed) in configs}) == [0, 1, 2]
    for (method, setting, seed), cfg in configs.items():
        dataset, n, s, model, body, partition = FEDREP_SETTINGS[setting]
        for field, want in FEDREP_COMMON.items():
            assert getattr(cfg, field) == want, (method, setting, field)
        assert (cfg.dataset, cfg.n_clients, cfg.model, cfg.partition) == (dataset, n, model, partition), (method, setting)
        assert cfg.partition_params["classes_per_client"] == s, (method, setting)
        if partition == "lognormal":   # "an average of 148 samples/client" (FedRep)
            assert cfg.partition_params["mean_size"] == 148
        if method in ("fedrep", "fedbsd"):
            assert (cfg.hparams["head_epochs"], cfg.hparams["body_epochs"]) == (10, body), (method, setting)
        if method.endswith("_ft"):
            assert cfg.hparams["ft_epochs"] == 10, (method, setting)


# Spectral co-distillation, App. B: "an SGD local optimizer with a momentum of 0.5 and with no weight decay",
# "T = 500 global communication rounds", "Batch size for CIFAR-10/100 and iNaturalist-2017 are 10 and 128",
# "full participation", "a learning rate of 0.01 (resp. 0.003) ... on CIFAR-10/100 (resp. iNaturalist-2017)";
# Sec. 4.1: "ResNet-18/34 and ResNet-50", "N = 100 (resp. N = 50)" for CIFAR-10 (resp. CIFAR-100), "N = 20" for
# iNaturalist; symmetric Dirichlet; "Average (3 trials)"; App. C: tau = 0.4, lambda_G = 0.05, lambda_p = 0.01.
SCD_DATASET = {"cifar10": ("resnet18", 100, 10, 0.01), "cifar100": ("resnet34", 50, 10, 0.01),
               "inaturalist": ("resnet50", 20, 128, 0.003)}
SCD_COMMON = dict(momentum=0.5, weight_decay=0.0, partition="dirichlet", split="global_test_by_proportion",
                  subsample=1.0, pool="train")
SCD_DEFAULTS = dict(tau=0.4, lam_g=0.05, lam_p=0.01)
# each table's dataset and alphas (Tables 1-3 by their captions; the ablations on CIFAR-10), and the SCD
# hyperparameter it sweeps (Table 5's ablation zeroes lambda_G / lambda_p)
SCD_TABLES = {"scd_table1": ("cifar10", {1.0, 0.5, 0.1}, None), "scd_table2": ("cifar100", {1.0, 0.1}, None),
              "scd_table3": ("inaturalist", {0.1}, None), "scd_table4": ("cifar10", {0.1}, None),
              "scd_table5": ("cifar10", {1.0, 0.1}, ("lam_g", "lam_p")), "scd_table6": ("cifar10", {1.0, 0.1}, ("tau",)),
              "scd_table7": ("cifar10", {1.0}, ("lam_g",)), "scd_table8": ("cifar10", {1.0}, ("lam_p",)),
              "scd_table9": ("cifar10", {0.1}, None), "scd_table10": ("cifar10", {1.0}, None),
              "scd_fig3": ("cifar10", {0.1}, None)}


@pytest.mark.parametrize("name", sorted(SCD_TABLES))
def test_scd_paper_profile_settings(name):
    dataset, alphas, swept = SCD_TABLES[name]
    configs = _paper(name)
    assert sorted({seed for (_, _, seed) in configs}) == [0, 1, 2]
    assert {c.partition_params["alpha"] for c in configs.values()} == alphas
    model, n, batch, lr = SCD_DATASET[dataset]
    for (method, setting, seed), cfg in configs.items():
        key = (method, setting)
        assert (cfg.dataset, cfg.model, cfg.n_clients, cfg.batch_size, cfg.lr) == (dataset, model, n, batch, lr), key
        for field, want in SCD_COMMON.items():
            assert getattr(cfg, field) == want, (key, field)
        # Table 10 is the partial-participation table (c = 0.1, 0.2); every other table trains every client
        assert cfg.participation == (float(setting.split("=")[1]) if name == "scd_table10" else 1.0), key
        if name == "scd_fig3":     # App. B: "80 existing clients and 20 new clients", "over 300 communication rounds"
            assert (cfg.new_clients, cfg.rounds) == (20, 300), key
        elif cfg.schedule["mode"] == "sync":   # Table 9's asynchronous servers count server steps instead
            assert cfg.rounds == 500, key
        if cfg.algorithm == "scd":
            for hp, want in SCD_DEFAULTS.items():
                if not swept or hp not in swept:
                    assert cfg.hparams[hp] == want, (key, hp)
