//! Quotes made by tpm2-tools, shared by the unit tests: raw quotes (the TPM structures), and
//! quotes as a boot report binds them.

// Produced by tpm2-tools 5.4 against swtpm 0.7.1 (not by this crate), with the AK template
// hawser uses:
//   tpm2_createprimary -C e -G ecc256:ecdsa-sha256:null -g sha256 \
//     -a 'fixedtpm|fixedparent|sensitivedataorigin|userwithauth|restricted|sign' -c ak.ctx
//   tpm2_readpublic -c ak.ctx -o ak.pub -f tss -n ak.name
//   tpm2_quote -c ak.ctx -l sha256:all -q 00112233445566778899aabbccddeeff -m attest.bin -s sig.bin
// and checked with tpm2_checkquote.
pub const AK_PUB: &str = "00580023000b00050072000000100018000b0003001000201b29f2c6fb969ef0911c077893db1a8f6b312b73f8459d5b4f0fb272f1fd37aa00208b64e546a5f9d2bcda204df540140078873fc9bfbb6000def0bd6fdef588c20c";
pub const AK_NAME: &str = "000bea8508f3c0dd3eb2a67ea1b423c3b475561f8cf50c224a411317075beb8bbb65";
pub const ATTEST: &str = "ff54434780180022000b4b6cc3742de42060a30c5f26029c98117d1d83d05542c3e8d7d7dbe56ec91d50001000112233445566778899aabbccddeeff00000000000024a5000000010000000001201910230016363600000001000b03ffffff0020c6aa24a1beb39abe4d9ec63a10eee77fd7fa5d9873d04e5de88c6364fc1fc3da";
pub const SIG: &str = "0018000b00205197a06cd372655f7a2fd75b806e84307b08dfb7cd77f02af998f7b6ee1ddc5c00205a18f9968eccfa127b447b6151f5799952468f47b9823c5905211b3fc4864598";
// A second quote of the same PCRs whose s is above n/2 (the TPM does not normalise s).
pub const ATTEST_HIGH_S: &str = "ff54434780180022000b4b6cc3742de42060a30c5f26029c98117d1d83d05542c3e8d7d7dbe56ec91d50001000112233445566778899aabbccddeeff00000000000018f5000000010000000001201910230016363600000001000b03ffffff0020c6aa24a1beb39abe4d9ec63a10eee77fd7fa5d9873d04e5de88c6364fc1fc3da";
pub const SIG_HIGH_S: &str = "0018000b00208bb8d989d4355a3d6d703f4233c6cd0f71b443d19f8c0c160e1b7c5101160ecf0020d01a5819a829c2706a21103dad84336123616441a7cbcaa6153ef534f099844f";

// Boot-report quotes of the same PCR state (PCR 11 = extend(0, enter-initrd), all-ones PCRs
// 17..=22), made the same way on another swtpm (so another AK), with the qualifying data a boot
// report binds for the nonce 00112233445566778899aabbccddeeff:
//   -q 819ca5a192c932bb5f375de145a4e1dd4ab5613afe297b65d08e9fc68002cfa5
//      = SHA-256("hawser boot report v1\0" || nonce), computed with Python's hashlib,
// and checked with tpm2_checkquote. The first quote's s is below n/2, the second's above.
pub const BOOT_REPORT_AK_PUB: &str = "00580023000b00050072000000100018000b000300100020e14ee624ac6722eb3e41f95c3d2c98f0cb4da5c6f5444155fd53c7decb9f09f60020486547111e2a5592706e9f248c078917503d9963c219f57336761bb3711b8df2";
pub const BOOT_REPORT_AK_NAME: &str =
    "000be54ddc71ccf3fd1d278bbe15e57f4b3cae2ed36902c861915dcb571bbac83c96";
pub const BOOT_REPORT_ATTEST: &str = "ff54434780180022000b9e951008349813d0fa55a75b9f9dea1eb752f59da65a6df98c5e18812cea3d3a0020819ca5a192c932bb5f375de145a4e1dd4ab5613afe297b65d08e9fc68002cfa5000000000000135e000000010000000001201910230016363600000001000b03ffffff0020c6aa24a1beb39abe4d9ec63a10eee77fd7fa5d9873d04e5de88c6364fc1fc3da";
pub const BOOT_REPORT_SIG: &str = "0018000b002007045a928767b6ee2ac00ea19ff118ffb74ed365a3436adcaf8e7e46d1f479da002012049ab8d51eaeaa4f0743bc51336465f38efb362aee3858073960848de0864f";
pub const BOOT_REPORT_ATTEST_HIGH_S: &str = "ff54434780180022000b9e951008349813d0fa55a75b9f9dea1eb752f59da65a6df98c5e18812cea3d3a0020819ca5a192c932bb5f375de145a4e1dd4ab5613afe297b65d08e9fc68002cfa50000000000000419000000010000000001201910230016363600000001000b03ffffff0020c6aa24a1beb39abe4d9ec63a10eee77fd7fa5d9873d04e5de88c6364fc1fc3da";
pub const BOOT_REPORT_SIG_HIGH_S: &str = "0018000b0020131014984f44a9ed1fddeda9b7f91fe633f2943d44e3d1bb171e8cba5aa067650020f30a205a4073012f6182efd241eb79225bb3c858e9557754e4ca25418d7cf61c";
