"""mt_bench stem: explain how something in the world works; then explain it to a child, or say what
would happen if one thing changed."""

from __future__ import annotations

import random
from typing import NamedTuple

from specbench.synth.item import Item
from specbench.synth.world import World, pick


class _Explanation(NamedTuple):
    question: str
    answer: str
    for_child: str       # the answer again, in two sentences for a child
    what_if: str         # a question about a change
    what_if_answer: str
    subject: str         # what is explained, as the child question names it


def _mill(rng: random.Random, world: World, town: str, river: str) -> _Explanation:
    """How a water mill on the town's river makes flour."""
    n, k = rng.randint(8, 24), rng.randint(2, 9) * 10
    t1 = f"Explain how the water mill on the river {river} in the town of {town} turns grain into flour."
    a1 = (f"The water mill uses the moving water of the river {river} to do work. The water pushes against "
          f"the {n} wooden paddles of the big wheel and makes the wheel turn. The wheel turns a long shaft, "
          "and the shaft turns a heavy stone inside the mill. The grain falls between this turning stone "
          "and a second stone that stays still, and it is crushed into flour. When the river is high, the "
          f"wheel turns faster and the mill can make about {k} kilograms of flour in one hour.")
    child = (f"The river {river} pushes the big wheel of the mill round and round, like your hand pushing "
             "a toy. The wheel turns a heavy stone that crushes the grain into soft flour for bread.")
    what_q = f"What would happen to the mill in the town of {town} if the river {river} dried up in a hot summer?"
    what_a = (f"If the river {river} dried up, no water would push the paddles, so the wheel would stop "
              "turning. Without the turning wheel, the stones would not move and the mill could not make "
              f"any flour. The people of the town of {town} would have to take their grain to another mill "
              "until the rain came back.")
    subject = f"the water mill in the town of {town}"
    return _Explanation(t1, a1, child, what_q, what_a, subject)


def _glass(rng: random.Random, world: World, town: str, river: str) -> _Explanation:
    """How a company's workers make glass."""
    cname = pick(rng, world.companies)
    temp, hours, minutes = rng.randint(12, 16) * 100, rng.randint(6, 30), rng.randint(2, 15)
    t1 = f"Explain how the workers at {cname} make glass from sand."
    a1 = (f"Glass is made from sand, soda and lime. The workers at {cname} mix these materials and heat "
          f"them in a furnace to about {temp} degrees. At this heat the mixture melts into a thick, "
          "glowing liquid. A worker gathers some of the liquid on the end of a long pipe and blows air "
          f"into it to form a bottle or a bowl. The glass is then cooled slowly for {hours} hours so "
          "that it does not crack.")
    child = (f"The workers at {cname} make sand so hot that it melts like honey. Then they blow it into "
             "shapes and let it cool until it is hard and clear.")
    what_q = (f"What would happen if the workers at {cname} cooled the glass in {minutes} minutes instead "
              f"of {hours} hours?")
    what_a = (f"If the glass cooled in only {minutes} minutes, the outside would become hard while the "
              "inside was still hot. The two parts would pull against each other, and many pieces would "
              f"crack or break. That is why the workers at {cname} cool the glass slowly over {hours} hours.")
    subject = f"how {cname} makes glass"
    return _Explanation(t1, a1, child, what_q, what_a, subject)


def _ice(rng: random.Random, world: World, town: str, river: str) -> _Explanation:
    """Why a lake freezes before the town's river."""
    lake = pick(rng, world.lakes)
    d, k = rng.randint(5, 20), rng.randint(3, 10)
    t1 = f"Why does {lake} freeze in winter while the river {river} often keeps flowing?"
    a1 = (f"{lake} freezes because its water is still. When the air is colder than zero degrees, the top "
          f"layer of the lake loses heat and turns to ice. In the river {river}, the water keeps moving, "
          "and the moving water mixes warmer water from below with the colder water at the top. This "
          f"mixing makes it much harder for ice to form. Only after many very cold days, below about "
          f"minus {d} degrees, does the river {river} freeze as well.")
    child = (f"When it is very cold, the still water of {lake} gets colder and colder until the top turns "
             f"into ice. The river {river} keeps moving, and moving water does not freeze as easily.")
    what_q = f"What would happen to {lake} if the winter were {k} degrees warmer?"
    what_a = (f"If the winter were {k} degrees warmer, the air above {lake} would often stay above zero "
              "degrees. The water would lose less heat, so the ice would be thin or would not form at "
              "all. People who skate or fish on the ice would have to wait for a colder year.")
    subject = f"why {lake} freezes"
    return _Explanation(t1, a1, child, what_q, what_a, subject)


def _rain(rng: random.Random, world: World, town: str, river: str) -> _Explanation:
    """Why a mountain's western side gets the rain."""
    mname = pick(rng, world.mountains)
    h = world.mountains[mname].height
    t1 = f"Explain why it rains much more on the western side of {mname} than on the eastern side."
    a1 = (f"Wind carries warm, wet air from the sea toward {mname}. When the air reaches the mountain, it "
          "is pushed upward along the slope. As the air rises, it cools, and cool air cannot hold as "
          "much water. The water forms clouds and falls as rain on the western side. "
          f"{mname} is {h} metres high, so by the time the air crosses the top, most of its water is "
          "gone, and the eastern side stays dry.")
    child = (f"When wet air climbs up {mname}, it gets cold and drops its water as rain on the western "
             "side. By the time the air comes down the other side, it has no rain left.")
    lower = rng.randint(2, 8) * 100
    what_q = f"What would change if {mname} were only {lower} metres high instead of {h} metres?"
    what_a = (f"If {mname} were only {lower} metres high, the air would not have to rise as far, so it "
              "would cool less and drop less rain. More of the water would stay in the air and cross to "
              "the eastern side. The difference between the wet western side and the dry eastern side "
              "would be much smaller.")
    subject = f"the rain on {mname}"
    return _Explanation(t1, a1, child, what_q, what_a, subject)


def _bread(rng: random.Random, world: World, town: str, river: str) -> _Explanation:
    """Why the town's bread rises."""
    temp, minutes = rng.randint(18, 25) * 10, rng.randint(25, 50)
    t1 = f"Explain why the bread made by the bakers of the town of {town} rises in the oven."
    a1 = ("Bread rises because of yeast, a tiny living thing that is mixed into the dough. The yeast eats "
          "the sugar in the flour and gives off a gas. The gas forms many small bubbles that are trapped "
          f"in the soft dough, so the dough grows bigger. In the oven at about {temp} degrees, the bubbles "
          "grow a little more, and then the heat makes the bread firm. After about "
          f"{minutes} minutes the bread has a brown crust and a light, soft middle.")
    child = ("Tiny living things called yeast eat the sugar in the dough and blow out little bubbles. "
             "The bubbles make the dough puff up, and the hot oven keeps it big and soft.")
    what_q = f"What would happen if the bakers of the town of {town} forgot to put yeast in the dough?"
    what_a = ("Without yeast, nothing would eat the sugar or make gas, so there would be no bubbles in "
              "the dough. The bread would stay flat and heavy, more like a thick biscuit than a soft loaf. "
              f"The bakers of the town of {town} would have to sell it as flat bread.")
    subject = f"the bread of the town of {town}"
    return _Explanation(t1, a1, child, what_q, what_a, subject)


def _bridge(rng: random.Random, world: World, town: str, river: str) -> _Explanation:
    """How the stone arch bridge over the town's river carries carts."""
    length, years = rng.randint(3, 20) * 10, rng.randint(2, 9) * 100
    t1 = f"Explain how the stone arch bridge over the river {river} in the town of {town} carries heavy carts."
    a1 = ("An arch bridge carries weight by pushing it outward and down. When a heavy cart rolls onto the "
          "bridge, its weight presses on the stones of the arch. Each stone pushes against the stones next "
          "to it, and the force travels along the curve of the arch to the ends. At each end, strong walls "
          f"of earth and stone push back and hold the arch in place. The bridge in the town of {town} is "
          f"{length} metres long, and its arch has stood for more than {years} years.")
    child = ("The stones of the bridge lean on each other in a curve, like friends holding hands. When a "
             "cart rolls over, the stones pass the push along to the ground at both ends.")
    what_q = f"What would happen to the bridge in the town of {town} if one of the end walls were taken away?"
    what_a = ("If one end wall were taken away, nothing would push back against that end of the arch. The "
              "stones would slide outward, the curve would open, and the arch would fall into the river "
              f"{river}. That is why the end walls of the bridge in the town of {town} are so thick.")
    subject = f"the bridge in the town of {town}"
    return _Explanation(t1, a1, child, what_q, what_a, subject)


_TOPICS = (_mill, _glass, _ice, _rain, _bread, _bridge)


def generate(rng: random.Random, world: World) -> Item:
    """An explanation of one of six topics; then the same for a child, or a what-if question."""
    topic = _TOPICS[rng.randrange(len(_TOPICS))]
    town = pick(rng, world.towns)
    e = topic(rng, world, town, world.towns[town].river)
    if rng.random() < 0.5:
        return Item("stem", [e.question, f"Explain {e.subject} to a child in two sentences."], [e.answer, e.for_child])
    return Item("stem", [e.question, e.what_if], [e.answer, e.what_if_answer])
