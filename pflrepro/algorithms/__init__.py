"""Algorithm registry: name -> class. Each class declares its hyperparameters in HPARAMS."""
from .apfl import APFL
from .base import Algorithm, Update
from .dcpfl import DCPFL
from .ditto import Ditto
from .fd import FD
from .fedala import FedALA
from .fedbabu import FedBABU
from .fedbn import FedBN
from .fedbsd import FedBSD
from .feddf import FedDF
from .fedfomo import FedFomo
from .fedgen import FedGen
from .fedgh import FedGH
from .fedkd import FedKD
from .fedpac import FedPAC
from .fedproto import FedProto
from .fedrep import FedRep
from .fedrod import FedRoD
from .fml import FML
from .forgetting import FedAvgLastLocal
from .hypcluster import HypCluster
from .l2gd import L2GD
from .partial import FedPer, LGFedAvg
from .perfed_ckt import PerFedCKT
from .perfedavg import PerFedAvg
from .pfedme import PFedMe
from .pfedsd import PFedSD
from .scaffold import Scaffold, ScaffoldFT
from .scd import SCD
from .server_opt import FedAvgM, FedDyn
from .simple import FedAvgFT, FedProx, FedProxFT, Local

ALGORITHMS = {cls.name: cls for cls in (Algorithm, Local, FedProx, FedAvgFT, FedPer, LGFedAvg, PFedSD,
                                           FedAvgLastLocal, PFedMe, FedFomo, DCPFL, FedGH, FedProto, FML, FedKD, FD,
                                           Ditto, FedAvgM, FedDyn, Scaffold, SCD, FedRep, FedRoD, FedBABU, FedBSD, FedBN,
                                           PerFedCKT, FedDF, FedGen, HypCluster, PerFedAvg, FedProxFT, ScaffoldFT, FedPAC, L2GD, APFL,
                                           FedALA)}

__all__ = ["ALGORITHMS", "Algorithm", "Update"]
