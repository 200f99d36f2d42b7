"""mt_bench roleplay: answer in character as one of the world's people."""

from __future__ import annotations

import random

from specbench.synth.english import with_article
from specbench.synth.item import Item
from specbench.synth.world import World, pick_person

#: What a person of each profession does in the morning, during the day and in the evening.
_ACTIVITIES = {
    "baker": ("light the big oven and knead the dough for the first loaves",
              "sell fresh bread and cakes to the people of the town",
              "clean the trays and plan the baking for the next day"),
    "teacher": ("prepare my lessons and read the homework of my pupils",
                "teach reading, writing and numbers to a class of children",
                "mark the exercise books and write notes for the parents"),
    "doctor": ("visit the patients who stayed overnight in the small hospital",
               "see people with fevers, coughs and broken bones",
               "read about new medicines and write down what I have learned"),
    "engineer": ("check the machines and the plans for the new bridge",
                 "measure, calculate and talk with the builders about each part",
                 "draw new designs at my desk by the light of a lamp"),
    "painter": ("mix my colours and stretch a fresh canvas",
                "paint the hills and the river while the light is good",
                "clean my brushes and look at what I have made"),
    "sailor": ("check the ropes and the sails of our ship",
               "steer the ship and watch the sky for bad weather",
               "eat with the crew and tell stories under the stars"),
    "farmer": ("feed the animals and milk the cows",
               "work in the fields, planting and cutting the crops",
               "repair the fences and count the sheep"),
    "architect": ("walk around the building sites to see the progress",
                  "draw plans for houses, schools and halls",
                  "meet the families who want a new home"),
    "musician": ("practise scales on my violin for an hour",
                 "teach music to young students in the town",
                 "play with my friends in the hall in front of an audience"),
    "carpenter": ("sharpen my tools and choose the wood for the day",
                  "build tables, chairs and doors in my workshop",
                  "sweep the floor and oil my tools"),
    "nurse": ("check on every patient and give them their medicine",
              "help the doctors and clean wounds",
              "write reports and speak with the night nurse"),
    "merchant": ("open my shop and count the goods on the shelves",
                 "buy and sell cloth, spices and tools with other traders",
                 "add up the money of the day in my book"),
    "writer": ("drink a cup of tea and read the news",
               "write a few pages of my new book",
               "read my pages again and change what does not sound right"),
    "fisher": ("row out onto the water before the sun rises",
               "pull in the nets and sort the fish",
               "mend the nets and sell the catch at the market"),
    "weaver": ("set up the threads on my loom",
               "weave cloth in bright colours for the market",
               "wash and dye the wool for the next day"),
    "librarian": ("open the library and put the returned books back on the shelves",
                  "help visitors find the books they need",
                  "write new cards for the catalogue"),
    "judge": ("read the papers for the cases of the day",
              "listen to both sides in the court and ask questions",
              "write down my decisions and the reasons for them"),
    "chemist": ("clean the glass tubes in my laboratory",
                "mix and heat substances and measure what happens",
                "write the results in my notebook"),
    "gardener": ("water the plants before the day gets hot",
                 "plant flowers, trim the hedges and pull weeds",
                 "rest on a bench and plan the next flower beds"),
    "blacksmith": ("light the forge and heat the iron",
                   "hammer the hot iron into tools and horseshoes",
                   "cool the tools and tidy the workshop"),
}
_ADVICE = (
    "be patient and practise a little every day",
    "learn from the people who have done the work for many years",
    "take good care of your tools and of your body",
    "always listen carefully before you speak",
    "never stop asking questions",
    "keep a notebook and write down everything you learn",
)


def generate(rng: random.Random, world: World) -> Item:
    """Speak as a person of the world about a day at work; then about the town, or a piece of advice."""
    p = pick_person(rng, world)
    town = p.hometown
    t = world.towns[town]
    job = with_article(p.profession)  # "a baker"
    act = _ACTIVITIES[p.profession]
    t1 = rng.choice((
        f"Pretend that you are {p.name}, {job} from the town of {town}. Describe a normal day in your life.",
        f"You are {p.name}, {job} who lives in the town of {town}. A visitor asks you what you do "
        "every day. Answer in character.",
        f"Play the role of {p.name}, {job} from the town of {town}, and tell me about your work.",
    ))
    a1 = (f"Good day to you! I am {p.name}, and I work as {job} in the town of {town}. Every morning I "
          f"get up at {rng.randint(4, 8)} o'clock and {act[0]}. Later in the day I {act[1]}. In the "
          f"evening I {act[2]}. It is hard work, but I would not change it for anything.")
    if rng.random() < 0.5:
        t2 = f"Stay in character as {p.name}. What do you like most about the town of {town}?"
        a2 = (f"As {job}, I love the town of {town}. The river {t.river} flows through it, and our "
              f"town is known for {t.landmark}. The town was founded in {t.founded}, and today "
              f"{t.population} people live here. I cannot imagine living anywhere else.")
    else:
        advice = rng.choice(_ADVICE)
        t2 = (f"Still speaking as {p.name}, give one piece of advice to a young person who wants to "
              f"become {job}.")
        a2 = (f"My advice is simple: {advice}. When I started as {job} in the town of {town}, I made "
              "many mistakes, but I learned something from each of them. If you love the work, the "
              "hard days will pass and the good days will stay with you.")
    return Item("roleplay", [t1, t2], [a1, a2])
