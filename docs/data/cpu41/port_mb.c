// forty-first session: vpmaddubsw, FMA and vpaddw throughput on this Zen 4 core (cycles at 3.66 GHz); gcc -O2 -mavx2 -mfma port_mb.c
#include <stdio.h>
#include <time.h>
#include <immintrin.h>
#define N 200000000L
static double now(){struct timespec a;clock_gettime(CLOCK_MONOTONIC,&a);return a.tv_sec+a.tv_nsec*1e-9;}
int main(){ double t; __m256i a=_mm256_set1_epi8(3), b=_mm256_set1_epi8(5);
__m256i y0=a,y1=a,y2=a,y3=a,y4=a,y5=a,y6=a,y7=a; __m256 f0=_mm256_set1_ps(1),f1=f0,f2=f0,f3=f0,m=_mm256_set1_ps(.999f),c=_mm256_set1_ps(.001f);
#define MAD(y) y=_mm256_maddubs_epi16(y,b)
#define FMA(f) f=_mm256_fmadd_ps(f,m,c)
#define ADD(y) y=_mm256_add_epi16(y,b)
#define BAR __asm__ volatile("" : "+x"(y0),"+x"(y1),"+x"(y2),"+x"(y3),"+x"(y4),"+x"(y5),"+x"(y6),"+x"(y7)); __asm__ volatile("" : "+x"(f0),"+x"(f1),"+x"(f2),"+x"(f3))
t=now(); for(long i=0;i<N;i++){MAD(y0);MAD(y1);MAD(y2);MAD(y3);MAD(y4);MAD(y5);MAD(y6);MAD(y7);BAR;} printf("8 maddubs: %.2f cyc/iter\n",(now()-t)*3.66e9/N);
t=now(); for(long i=0;i<N;i++){MAD(y0);MAD(y1);MAD(y2);MAD(y3);MAD(y4);MAD(y5);MAD(y6);MAD(y7);FMA(f0);FMA(f1);FMA(f2);FMA(f3);BAR;} printf("8 maddubs+4 fma: %.2f\n",(now()-t)*3.66e9/N);
t=now(); for(long i=0;i<N;i++){MAD(y0);MAD(y1);MAD(y2);MAD(y3);ADD(y4);ADD(y5);ADD(y6);ADD(y7);BAR;} printf("4 maddubs+4 paddw: %.2f\n",(now()-t)*3.66e9/N);
t=now(); for(long i=0;i<N;i++){ADD(y0);ADD(y1);ADD(y2);ADD(y3);ADD(y4);ADD(y5);ADD(y6);ADD(y7);BAR;} printf("8 paddw: %.2f\n",(now()-t)*3.66e9/N);
t=now(); for(long i=0;i<N;i++){BAR;} printf("empty: %.2f\n",(now()-t)*3.66e9/N);
int o[8]; _mm256_storeu_si256((__m256i*)o,_mm256_add_epi16(_mm256_add_epi16(y0,y7),_mm256_cvtps_epi32(f0))); return o[0]&1;}
