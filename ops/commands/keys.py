"""`hilo keys generate`: an Ed25519 key pair for signing a run."""
from . import COMMANDS
from .args import command_group


def generate(a):
    """Write OUT/trainer.key and OUT/trainer.pub."""
    from hilo.schemas.signing import Verifier, generate as do_generate
    private, public = do_generate(a.out)
    print(f"{private} (the trainer's: --signing-key; mode 0600)\n{public} (for every site: --trust; key id "
          f"{Verifier.load(public).key_id.hex()})")
    return 0


def register(sub):
    """The keys command group."""
    ksub = command_group(sub, "keys", COMMANDS["keys"][1])
    k = ksub.add_parser("generate", help="an Ed25519 key pair: OUT/trainer.key (mode 0600) and OUT/trainer.pub")
    k.add_argument("--out", required=True, metavar="DIR",
                   help="directory to write the two files into (never overwrites)")
    k.set_defaults(fn=generate)
