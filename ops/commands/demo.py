"""`hilo demo`: trainer + 3 sites on an embedded log, one site SIGKILLed and restarted."""
from . import COMMANDS
from .args import at_least


def run(a):
    """Run the demo; exit 0 only if every site reaches the trainer's digest."""
    from hilo.ops.demo import run_demo
    return run_demo(a.log, a.steps, a.json)


def register(sub):
    """The demo's parser."""
    p = sub.add_parser("demo", help=COMMANDS["demo"][1])
    p.add_argument("--log", default=None, metavar="URL", help="default: file:// log in a temp folder (no broker)")
    p.add_argument("--steps", type=at_least(3), default=40,
                   help="training steps / versions, >= 3: site-2 is killed at a third "
                   "and restarted at two thirds (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.set_defaults(fn=run)
