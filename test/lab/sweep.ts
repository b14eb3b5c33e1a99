/**
 * `node test/lab/sweep.ts`: removes what dead lab owners left behind (netns, links, nft tables,
 * slot directories). Safe to run while other tests run: live owners' slots are never touched.
 */
import { sweepSlots } from './slots.ts';

const cleaned = sweepSlots();
process.stdout.write(cleaned.length > 0 ? `swept lab slots: ${cleaned.join(', ')}\n` : 'no lab leftovers\n');
