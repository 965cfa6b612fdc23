"""A fixed text set for teacher-forced KV-codec evaluation: 8 varied passages
of well over 128 tokens each in common tokenizers (written for augury)."""

PASSAGES: tuple[str, ...] = (
    "The lighthouse keeper climbed the spiral stairs every evening at six, carrying a tin of oil and a "
    "cloth folded into a neat square. For thirty years the routine had not changed: trim the wick, polish "
    "the lens, check the clockwork that turned the great light through its slow circle. Ships that passed "
    "the headland never saw him, only the beam, and he liked it that way. In winter the wind pressed "
    "against the glass so hard that the whole tower seemed to lean, and he would sit with his back to the "
    "wall and listen to the sea arguing with the rocks below. When the coast guard finally installed an "
    "automatic lamp, they offered him a pension and a cottage in the village. He took the cottage, but he "
    "still walked to the point each evening to watch the light come on by itself.",
    "To compute the greatest common divisor of two integers, Euclid's algorithm repeatedly replaces the "
    "larger number by the remainder of dividing it by the smaller one. When the remainder becomes zero, the "
    "last non-zero value is the answer. For example, starting from 1071 and 462, we divide to get a "
    "remainder of 147, then 462 and 147 give 21, and 147 and 21 give 0, so the divisor is 21. The method "
    "needs at most a number of steps proportional to the number of digits of the smaller input, which is "
    "why it remains the standard approach more than two thousand years after it was first written down. "
    "An extended version also returns coefficients x and y such that ax + by equals the divisor, a fact "
    "used every day in modular arithmetic and public-key cryptography.",
    "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n    out = []\n"
    "    i = j = 0\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n"
    "            out.append(a[i])\n            i += 1\n        else:\n            out.append(b[j])\n"
    "            j += 1\n    out.extend(a[i:])\n    out.extend(b[j:])\n    return out\n\n\n"
    "def merge_sort(xs):\n    if len(xs) <= 1:\n        return list(xs)\n    mid = len(xs) // 2\n"
    "    return merge_sorted(merge_sort(xs[:mid]), merge_sort(xs[mid:]))\n\n\n"
    "if __name__ == \"__main__\":\n    data = [38, 27, 43, 3, 9, 82, 10]\n"
    "    print(merge_sort(data))  # [3, 9, 10, 27, 38, 43, 82]\n",
    "Customer: Hi, I ordered a pair of hiking boots last week and they arrived today, but they are one size "
    "too small. Can I exchange them?\nAgent: Of course! I'm sorry about the fit. Could you give me your "
    "order number so I can look it up?\nCustomer: Sure, it's 58-2214-907.\nAgent: Thank you. I can see the "
    "order for the Ridgeline boots in size 42. Would you like size 43 in the same colour?\nCustomer: Yes, "
    "the brown ones, please. Do I need to pay for shipping again?\nAgent: No, exchanges are free. I'll email "
    "you a prepaid return label within the next hour. Once the courier scans the package, we will send the "
    "new pair right away, usually within two business days.\nCustomer: Perfect, thanks for your help.\n"
    "Agent: You're welcome. Enjoy the trails!",
    "Photosynthesis takes place mainly in the leaves of green plants, inside small structures called "
    "chloroplasts. Chlorophyll, the pigment that gives leaves their colour, absorbs red and blue light and "
    "uses that energy to split water molecules, releasing oxygen as a by-product. The hydrogen and energy "
    "captured in this first stage are then used in the Calvin cycle, where carbon dioxide from the air is "
    "fixed into three-carbon sugars. These sugars become glucose, starch and cellulose, the building "
    "blocks of almost every food chain on land. On a sunny day a large tree can release several hundred "
    "litres of oxygen, and the total amount produced by plants and algae each year is measured in hundreds "
    "of billions of tonnes. Without this process the atmosphere would contain almost no free oxygen at all.",
    "Minutes of the neighbourhood association meeting, March 14. Present: twelve members and the treasurer. "
    "1. The treasurer reported a balance of 2,315 euros after paying for the spring clean-up supplies. "
    "2. The proposal to install two new benches in the park was approved by nine votes to three; the "
    "committee will ask the city for matching funds. 3. Residents of Oak Street raised concerns about "
    "traffic speed near the school. It was agreed to request a speed survey and, if the results support "
    "it, a raised crossing. 4. The summer festival will be held on the last Saturday of June. Volunteers "
    "are needed for the food stalls, the children's games and the evening concert. 5. Any other business: "
    "none. The meeting closed at 21:40. Next meeting: April 11, in the library annex.",
    "In 1858 a young surveyor named Elena Varga crossed the northern pass with two mules, a theodolite and "
    "a notebook bound in oilcloth. Her task was to map the watershed between two rival provinces, each of "
    "which claimed the high pastures and the silver seams beneath them. She spent four summers measuring "
    "angles from peak to peak, sleeping in shepherds' huts and paying local guides with coffee and salt. "
    "Her final map showed that the river everyone called the boundary actually split in two above the "
    "lake, and that the disputed valley drained into neither province. The discovery embarrassed both "
    "governments and delayed the treaty by a decade, but the map itself was so accurate that it was still "
    "used by the railway engineers who tunnelled through the mountain fifty years later.",
    "Recipe for a simple lentil soup, serves four. Rinse 250 grams of red lentils until the water runs "
    "clear. In a large pot, warm two tablespoons of olive oil over medium heat and add one chopped onion, "
    "two sliced carrots and a stick of celery. Cook for eight minutes, stirring, until the onion is soft. "
    "Add two crushed garlic cloves, a teaspoon of ground cumin and half a teaspoon of smoked paprika and "
    "cook for one more minute. Pour in the lentils, a tin of chopped tomatoes and one litre of vegetable "
    "stock. Bring to the boil, then lower the heat and simmer for twenty-five minutes, until the lentils "
    "fall apart. Season with salt, pepper and the juice of half a lemon. Blend half of the soup for a "
    "creamier texture, and serve with warm bread and a spoon of yoghurt.",
)

PASSKEY_FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)
